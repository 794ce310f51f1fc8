//! Host tests for initialisation, the site state machine, the schemes and
//! the patch order, on a fake text buffer.

mod common;

use common::{
    BASE, FUNCTION_BYTES, LIST_OPS, NOP_OPS, Reg, SITES, TRAMPOLINE, Table, Text, VECTOR_OPS, Write, config, setup,
    tracer_ops,
};
use ftrace::{
    BranchError, CallSite, EnableOrder, Error, MOV_X9_X30, NOP, NOP_LITERAL, PACIASP, Scheme, SiteState, Target,
    TextPatcher, TracerId, TracerState, decode_bl,
};

fn bl(site: CallSite) -> u32 {
    site.bl_to(TRAMPOLINE).unwrap()
}

/// Site `index` as the text shows it: (literal, mov present, call slot is BL).
fn text_state(text: &Text, index: usize) -> (u64, bool, bool) {
    let site = text.site(index);
    let call = text.word(site.call());
    assert!(call == NOP || decode_bl(site.call(), call) == Some(TRAMPOLINE), "call slot {call:#x}");
    (text.read_u64(site.literal()), text.word(site.function()) == MOV_X9_X30, call != NOP)
}

#[test]
fn initialise_writes_literal_and_mov_once_per_site() {
    let table = Table::new();
    let mut text = Text::new(SITES);
    let mut registry = Reg::new(&table);
    let entries = text.entries();
    assert_eq!(registry.initialise(entries.clone(), config(Scheme::CallOps), &mut text, |_| true), Ok(SITES));
    assert_eq!(text.log.last(), Some(&Write::Synchronize));
    let log = text.take_log();
    assert_eq!(log.len(), 2 * SITES);
    for index in 0..SITES {
        let site = text.site(index);
        assert_eq!(registry.call_site(index), Some(site), "sites are sorted by entry");
        assert_eq!(registry.site_state(index), Some(SiteState::Disabled { literal: NOP_OPS }));
        let writes: Vec<_> =
            log.iter().filter(|w| text_address(w) >= site.entry() && text_address(w) < site.entry() + 16).collect();
        assert_eq!(
            writes,
            [
                &Write::U64 { address: site.literal(), value: NOP_OPS },
                &Write::U32 { address: site.function(), value: MOV_X9_X30 }
            ]
        );
        assert_eq!(text_state(&text, index), (NOP_OPS, true, false));
        assert_eq!(text.word(site.entry() + 16), PACIASP, "never touched");
        // The read side finds the site from what the trampoline has in x30.
        assert_eq!(table.site_index(CallSite::from_return_address(site.return_address()).entry()), Some(index));
    }
    assert_eq!(table.site_count(), SITES);
    assert_eq!(table.site_index(BASE + 8), None);

    // NOP -> MOV is never written again: not by a second initialise...
    let before = text.words.clone();
    assert_eq!(
        registry.initialise(entries, config(Scheme::CallOps), &mut text, |_| true),
        Err(Error::AlreadyInitialised)
    );
    assert_eq!(text.words, before);
    assert!(text.log.is_empty());
    // ...nor by enabling and disabling, whatever the scheme.
    for scheme in [Scheme::CallOps, Scheme::List, Scheme::Vector] {
        registry.set_scheme(scheme).unwrap();
        let a = registry.register(tracer_ops(1), 0..SITES).unwrap();
        let b = registry.register(tracer_ops(2), [3, 4]).unwrap();
        registry.apply(&mut text).unwrap();
        registry.unregister(a).unwrap();
        registry.unregister(b).unwrap();
        let applied = registry.apply(&mut text).unwrap();
        registry.grace_period_elapsed(applied.generation);
    }
    for index in 0..SITES {
        assert_eq!(text.writes_to(text.site(index).function()), 0);
        assert!(text.writes_to(text.site(index).call()) >= 2);
    }
}

fn text_address(write: &Write) -> u64 {
    match write {
        Write::U32 { address, .. } | Write::U64 { address, .. } => *address,
        Write::Synchronize => 0,
    }
}

#[test]
fn initialise_errors_leave_the_text_untouched() {
    let entries = Text::new(SITES).entries();
    let cases: Vec<(Vec<u64>, u64, Error)> = vec![
        ([&entries[1..], &[BASE + 4]].concat(), TRAMPOLINE, Error::MisalignedEntry { entry: BASE + 4 }),
        ([&entries[1..], &[BASE + 64]].concat(), TRAMPOLINE, Error::DuplicateEntry { entry: BASE + 64 }),
        (
            entries.clone(),
            BASE + 12 + (128 << 20),
            Error::Branch(BranchError::OutOfRange { from: BASE + 12, to: BASE + 12 + (128 << 20) }),
        ),
        (
            entries.clone(),
            TRAMPOLINE + 2,
            Error::Branch(BranchError::Misaligned { from: BASE + 12, to: TRAMPOLINE + 2 }),
        ),
        ((0..=SITES as u64).map(|i| BASE + 32 * i).collect(), TRAMPOLINE, Error::TooManySites { capacity: SITES }),
    ];
    for (entries, trampoline, error) in cases {
        let table = Table::new();
        let mut registry = Reg::new(&table);
        let mut text = Text::new(SITES + 1);
        let pristine = text.words.clone();
        let config = ftrace::Config { trampoline, ..config(Scheme::CallOps) };
        assert_eq!(registry.initialise(entries, config, &mut text, |_| true), Err(error));
        assert_eq!(text.words, pristine);
        assert!(text.log.is_empty());
        assert_eq!(registry.register(tracer_ops(1), [0]), Err(Error::NotInitialised));
    }

    // The farthest reachable trampoline is fine.
    let table = Table::new();
    let mut registry = Reg::new(&table);
    let mut text = Text::new(SITES);
    let entries = text.entries();
    let trampoline = BASE + 12 + (128 << 20) - 4;
    let config = ftrace::Config { trampoline, ..config(Scheme::CallOps) };
    assert_eq!(registry.initialise(entries, config, &mut text, |_| true), Ok(SITES));

    // A site already patched (here: a literal that is not two NOPs) is refused.
    let table = Table::new();
    let mut registry = Reg::new(&table);
    let mut text = Text::new(SITES);
    text.set_word(BASE + 5 * FUNCTION_BYTES + 4, 0x1234_5678);
    let pristine = text.words.clone();
    let entries = text.entries();
    assert_eq!(
        registry.initialise(entries, common::config(Scheme::CallOps), &mut text, |_| true),
        Err(Error::UnexpectedInstruction { address: BASE + 5 * FUNCTION_BYTES + 4, expected: NOP, found: 0x1234_5678 })
    );
    assert_eq!(text.words, pristine);
}

#[test]
fn excluded_sites_stay_uninitialised_and_cannot_be_traced() {
    let table = Table::new();
    let mut registry = Reg::new(&table);
    let mut text = Text::new(SITES);
    let excluded = BASE + 2 * FUNCTION_BYTES;
    let entries = text.entries();
    assert_eq!(
        registry.initialise(entries, config(Scheme::CallOps), &mut text, |entry| entry != excluded),
        Ok(SITES - 1)
    );
    assert_eq!(registry.site_state(2), Some(SiteState::Uninitialised));
    assert_eq!(text.read_u64(excluded), NOP_LITERAL);
    assert_eq!(text.word(excluded + 8), NOP);
    // Tracing it would need NOP -> MOV at run time: an error, and nothing published.
    assert_eq!(registry.register(tracer_ops(1), [1, 2]), Err(Error::SiteNotInitialised { site: 2 }));
    assert_eq!(registry.register(tracer_ops(1), [SITES]), Err(Error::NoSuchSite { site: SITES }));
    assert!(table.registered().is_empty());
    assert!(!table.relevant(1).contains(TracerId(0)), "the failed registration's bits were rolled back");
    // A predicate only sees initialised sites.
    let all = registry.register_where(tracer_ops(1), |_, _| true).unwrap();
    assert!(!table.traces(2, all));
    text.log.clear();
    registry.apply(&mut text).unwrap();
    assert_eq!(text.writes_to(excluded), 0);
    assert_eq!(text.writes_to(excluded + 8), 0);
    assert_eq!(text.writes_to(excluded + 12), 0);
    assert_eq!(registry.target(2), None);
    assert_eq!(registry.target(1), Some(Target::Own(all)));
}

#[test]
fn enable_writes_literal_then_bl_and_disable_the_reverse() {
    let table = Table::new();
    let (mut text, mut registry) = setup(&table, Scheme::CallOps);
    let site = text.site(3);
    let a = registry.register(tracer_ops(1), [3]).unwrap();
    assert!(text.log.is_empty(), "registration does not patch");
    assert!(table.traces(3, a) && !table.traces(4, a));

    let applied = registry.apply(&mut text).unwrap();
    assert_eq!((applied.enabled, applied.literal_writes, applied.instruction_writes), (1, 1, 1));
    assert_eq!(
        text.take_log(),
        [
            Write::U64 { address: site.literal(), value: tracer_ops(1) },
            Write::U32 { address: site.call(), value: bl(site) }
        ]
    );
    assert_eq!(registry.site_state(3), Some(SiteState::Calling { literal: tracer_ops(1) }));
    assert_eq!(text_state(&text, 3), (tracer_ops(1), true, true));

    // Nothing changed: nothing written.
    let applied = registry.apply(&mut text).unwrap();
    assert_eq!((applied.literal_writes, applied.instruction_writes), (0, 0));
    assert!(text.log.is_empty());

    registry.unregister(a).unwrap();
    assert_eq!(registry.tracer_state(a), Some(TracerState::Unregistered));
    assert!(!table.traces(3, a), "unpublished at once");
    let applied = registry.apply(&mut text).unwrap();
    assert_eq!((applied.disabled, applied.literal_writes, applied.instruction_writes), (1, 1, 1));
    assert_eq!(
        text.take_log(),
        [Write::U64 { address: site.literal(), value: NOP_OPS }, Write::U32 { address: site.call(), value: NOP }]
    );
    assert_eq!(text_state(&text, 3), (NOP_OPS, true, false));
    assert_eq!(registry.site_state(3), Some(SiteState::Disabled { literal: NOP_OPS }));
}

/// The wrong order a patcher may ask for (the kernel's race tests must catch it) swaps exactly
/// the two enabling stores, and nothing else.
#[test]
fn wrong_order_switch_enables_the_bl_before_the_literal() {
    let table = Table::new();
    let (mut text, mut registry) = setup(&table, Scheme::CallOps);
    let site = text.site(3);
    text.enable_order = EnableOrder::BlFirst;
    registry.register(tracer_ops(1), [3]).unwrap();
    registry.apply(&mut text).unwrap();
    assert_eq!(
        text.take_log(),
        [
            Write::U32 { address: site.call(), value: bl(site) },
            Write::U64 { address: site.literal(), value: tracer_ops(1) }
        ]
    );
    assert_eq!(text_state(&text, 3), (tracer_ops(1), true, true));
}

#[test]
fn second_tracer_on_a_site_with_its_own_ops_swaps_only_the_literal() {
    let table = Table::new();
    let (mut text, mut registry) = setup(&table, Scheme::CallOps);
    let (s3, s4) = (text.site(3), text.site(4));
    let a = registry.register(tracer_ops(1), [3]).unwrap();
    registry.apply(&mut text).unwrap();
    text.log.clear();

    let b = registry.register(tracer_ops(2), [3, 4]).unwrap();
    // Site 3 calls A directly until the apply: B is not reached there yet.
    assert_eq!(text_state(&text, 3), (tracer_ops(1), true, true));
    let applied = registry.apply(&mut text).unwrap();
    assert_eq!((applied.enabled, applied.retargeted), (1, 1));
    assert_eq!(
        text.take_log(),
        [
            Write::U64 { address: s3.literal(), value: LIST_OPS },
            Write::U64 { address: s4.literal(), value: tracer_ops(2) },
            Write::U32 { address: s4.call(), value: bl(s4) },
        ]
    );
    assert_eq!(registry.target(3), Some(Target::List));
    assert_eq!(registry.target(4), Some(Target::Own(b)));
    // What the list function sees for site 3: both, and both by the O(1) test.
    assert_eq!(table.relevant(3).iter().collect::<Vec<_>>(), [a, b]);
    assert!(table.traces(3, a) && table.traces(3, b) && table.traces(4, b) && !table.traces(4, a));
    assert_eq!(table.ops_address(b), tracer_ops(2));

    registry.unregister(b).unwrap();
    registry.apply(&mut text).unwrap();
    assert_eq!(
        text.take_log(),
        [
            Write::U64 { address: s3.literal(), value: tracer_ops(1) },
            Write::U64 { address: s4.literal(), value: NOP_OPS },
            Write::U32 { address: s4.call(), value: NOP },
        ]
    );
}

#[test]
fn list_scheme_and_switching_schemes_are_literal_stores() {
    let table = Table::new();
    let (mut text, mut registry) = setup(&table, Scheme::List);
    let a = registry.register(tracer_ops(1), [1, 2]).unwrap();
    let b = registry.register(tracer_ops(2), [2, 3]).unwrap();
    registry.apply(&mut text).unwrap();
    for index in 1..=3 {
        assert_eq!(text_state(&text, index), (LIST_OPS, true, true));
    }
    text.log.clear();

    registry.set_scheme(Scheme::CallOps).unwrap();
    let applied = registry.apply(&mut text).unwrap();
    assert_eq!((applied.retargeted, applied.literal_writes, applied.instruction_writes), (2, 2, 0));
    assert!(text.take_log().iter().all(|write| matches!(write, Write::U64 { .. })));
    assert_eq!(text_state(&text, 1), (tracer_ops(1), true, true));
    assert_eq!(text_state(&text, 2), (LIST_OPS, true, true));
    assert_eq!(text_state(&text, 3), (tracer_ops(2), true, true));

    registry.set_scheme(Scheme::Vector).unwrap();
    registry.apply(&mut text).unwrap();
    assert_eq!(text.take_log(), [Write::U64 { address: text.site(2).literal(), value: VECTOR_OPS.address(0) }]);
    assert_eq!(registry.site_vector(2), Some(0));
    assert_eq!(table.vector(0).iter().collect::<Vec<_>>(), [a, b]);
}

#[test]
fn vectors_are_shared_immutable_and_reclaimed_after_a_grace_period() {
    let table = Table::new();
    let (mut text, mut registry) = setup(&table, Scheme::Vector);
    let a = registry.register(tracer_ops(1), [1, 5, 6]).unwrap();
    let b = registry.register(tracer_ops(2), [1, 5, 6]).unwrap();
    let c = registry.register(tracer_ops(3), [6]).unwrap();
    registry.apply(&mut text).unwrap();
    // Sites 1 and 5 share one slot; site 6 has its own set.
    assert_eq!(registry.site_vector(1), registry.site_vector(5));
    let shared = registry.site_vector(1).unwrap();
    let own = registry.site_vector(6).unwrap();
    assert_ne!(shared, own);
    assert_eq!(text_state(&text, 5), (VECTOR_OPS.address(shared), true, true));
    assert_eq!(table.vector(shared).iter().collect::<Vec<_>>(), [a, b]);
    assert_eq!(table.vector(own).iter().collect::<Vec<_>>(), [a, b, c]);

    // Unregistering drops the tracer from every vector at once...
    registry.unregister(a).unwrap();
    assert_eq!(table.vector(shared).iter().collect::<Vec<_>>(), [b]);
    // ...and apply moves the sites to B's own ops and to a new vector {b, c}:
    // the old vectors are retired, not rewritten.
    let applied = registry.apply(&mut text).unwrap();
    assert_eq!(text_state(&text, 1), (tracer_ops(2), true, true));
    let fresh = registry.site_vector(6).unwrap();
    assert!(fresh != shared && fresh != own);
    assert_eq!(table.vector(fresh).iter().collect::<Vec<_>>(), [b, c]);
    assert_eq!(registry.tracer_state(a), Some(TracerState::Retired { generation: applied.generation }));

    // Before the grace period neither the old slots nor A's id can be reused.
    let d = registry.register(tracer_ops(4), [7]).unwrap();
    assert_ne!(d, a);
    let reclaimed = registry.grace_period_elapsed(applied.generation - 1);
    assert!(reclaimed.tracers.is_empty() && reclaimed.vectors == 0);
    let reclaimed = registry.grace_period_elapsed(applied.generation);
    assert_eq!(reclaimed.tracers.iter().collect::<Vec<_>>(), [a]);
    assert_eq!(reclaimed.vectors, 2);
    assert_eq!(registry.tracer_state(a), Some(TracerState::Free));
    assert_eq!(table.ops_address(a), 0);
    // A's id is reused, with none of A's sites.
    let e = registry.register(tracer_ops(5), [9]).unwrap();
    assert_eq!(e, a);
    assert!(!table.traces(1, e) && table.traces(9, e));
}

#[test]
fn vector_fallback_to_the_list_when_slots_run_out() {
    let table = ftrace::DispatchTable::<SITES, 2, 1>::new();
    let mut text = Text::new(SITES);
    let mut registry = ftrace::Registry::new(&table);
    let entries = text.entries();
    registry.initialise(entries, config(Scheme::Vector), &mut text, |_| true).unwrap();
    registry.register(tracer_ops(1), [1, 2]).unwrap();
    registry.register(tracer_ops(2), [1, 2]).unwrap();
    registry.register(tracer_ops(3), [2]).unwrap();
    let applied = registry.apply(&mut text).unwrap();
    assert_eq!(applied.vector_fallbacks, 1);
    assert_eq!(text_state(&text, 1), (VECTOR_OPS.address(0), true, true));
    assert_eq!(text_state(&text, 2), (LIST_OPS, true, true));
}

#[test]
fn a_registry_of_128_tracers_like_the_benchmark() {
    let table = Table::new();
    let (mut text, mut registry) = setup(&table, Scheme::CallOps);
    // 1 relevant and 100 irrelevant tracers: the traced site keeps its own ops.
    let relevant = registry.register(tracer_ops(0), [0]).unwrap();
    let irrelevant: Vec<_> = (1..=100).map(|n| registry.register(tracer_ops(n), [1]).unwrap()).collect();
    registry.apply(&mut text).unwrap();
    assert_eq!(text_state(&text, 0), (tracer_ops(0), true, true));
    assert_eq!(table.relevant(0).iter().collect::<Vec<_>>(), [relevant]);
    assert_eq!(table.registered().len(), 101);
    // 27 more fill the registry.
    for n in 101..128 {
        registry.register(tracer_ops(n), [0]).unwrap();
    }
    assert_eq!(registry.register(tracer_ops(200), [0]), Err(Error::RegistryFull));
    registry.apply(&mut text).unwrap();
    assert_eq!(text_state(&text, 0), (LIST_OPS, true, true));
    assert_eq!(table.relevant(0).len(), 28);
    assert!(irrelevant.iter().all(|&t| !table.traces(0, t) && table.traces(1, t)));
    assert_eq!(registry.unregister(TracerId(128)), Err(Error::NotRegistered { tracer: TracerId(128) }));
}

#[test]
fn text_changed_behind_the_registrys_back_stops_apply() {
    let table = Table::new();
    let (mut text, mut registry) = setup(&table, Scheme::CallOps);
    let site = text.site(4);
    let a = registry.register(tracer_ops(1), [3, 4, 5]).unwrap();
    text.set_word(site.call(), 0xd420_0080); // Somebody put a BRK there.
    assert_eq!(
        registry.apply(&mut text),
        Err(Error::UnexpectedInstruction { address: site.call(), expected: NOP, found: 0xd420_0080 })
    );
    // Site 3 was done, site 4 untouched, site 5 not reached; the state says so.
    assert_eq!(registry.site_state(3), Some(SiteState::Calling { literal: tracer_ops(1) }));
    assert_eq!(registry.site_state(4), Some(SiteState::Disabled { literal: NOP_OPS }));
    assert_eq!(registry.site_state(5), Some(SiteState::Disabled { literal: NOP_OPS }));
    assert_eq!(text.read_u64(site.literal()), NOP_OPS);
    text.set_word(site.call(), NOP);
    registry.apply(&mut text).unwrap();
    assert_eq!(text_state(&text, 5), (tracer_ops(1), true, true));

    text.set_word(site.literal(), 0);
    registry.unregister(a).unwrap();
    assert!(
        matches!(registry.apply(&mut text), Err(Error::UnexpectedLiteral { expected, .. }) if expected == tracer_ops(1))
    );
}

#[test]
fn null_ops_are_refused() {
    let table = Table::new();
    let (_text, mut registry) = setup(&table, Scheme::CallOps);
    assert_eq!(registry.register(0, [0]), Err(Error::NullAddress));
    let table = Table::new();
    let mut registry = Reg::new(&table);
    let mut text = Text::new(SITES);
    let entries = text.entries();
    let config = ftrace::Config { nop_ops: 0, ..config(Scheme::CallOps) };
    assert_eq!(registry.initialise(entries, config, &mut text, |_| true), Err(Error::NullAddress));
}
