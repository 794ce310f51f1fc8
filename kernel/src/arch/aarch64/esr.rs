//! The Exception Syndrome Register, decoded in one place (ARM ARM D24.2.40, ESR_EL1).

/// Exception classes (ESR_ELx.EC) the kernel tells apart.
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
#[repr(u8)]
pub enum ExceptionClass {
    Unknown = 0x00,
    Svc64 = 0x15,
    SystemRegisterTrap = 0x18,
    PointerAuthFailure = 0x1c,
    InstructionAbortLowerEl = 0x20,
    InstructionAbort = 0x21,
    PcAlignment = 0x22,
    DataAbortLowerEl = 0x24,
    DataAbort = 0x25,
    SpAlignment = 0x26,
    SError = 0x2f,
    SoftwareStepLowerEl = 0x32,
    SoftwareStep = 0x33,
    Brk = 0x3c,
    Other = 0xff,
}

impl ExceptionClass {
    #[inline]
    pub fn of(esr: u64) -> Self {
        Esr(esr).class()
    }
}

/// The fault status code of an instruction or data abort (ISS.xFSC), decoded.
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub enum FaultStatus {
    Translation { level: u8 },
    AccessFlag { level: u8 },
    Permission { level: u8 },
    Alignment,
    SynchronousExternal,
    Other(u8),
}

impl FaultStatus {
    pub fn of(esr: u64) -> Self {
        let fsc = (esr & 0x3f) as u8;
        let level = fsc & 3;
        match fsc >> 2 {
            0b0001 => Self::Translation { level },
            0b0010 => Self::AccessFlag { level },
            0b0011 => Self::Permission { level },
            _ if fsc == 0b10_0001 => Self::Alignment,
            _ if fsc == 0b01_0000 => Self::SynchronousExternal,
            _ => Self::Other(fsc),
        }
    }
}

/// An ESR_ELx value. The `EC_*` constants are the raw classes, for `match` patterns on `ec()`
/// (the trap table matches raw numbers so that no enum conversion sits on the hit path).
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
#[repr(transparent)]
pub struct Esr(pub u64);

impl Esr {
    pub const EC_SVC64: u8 = ExceptionClass::Svc64 as u8;
    pub const EC_DATA_ABORT_LOWER_EL: u8 = ExceptionClass::DataAbortLowerEl as u8;
    pub const EC_DATA_ABORT: u8 = ExceptionClass::DataAbort as u8;
    pub const EC_SOFTWARE_STEP_LOWER_EL: u8 = ExceptionClass::SoftwareStepLowerEl as u8;
    pub const EC_SOFTWARE_STEP: u8 = ExceptionClass::SoftwareStep as u8;
    pub const EC_BRK: u8 = ExceptionClass::Brk as u8;

    /// ESR.IL: a 32-bit instruction.
    const IL: u64 = 1 << 25;
    /// ISS.WnR of a data abort.
    const WNR: u64 = 1 << 6;

    /// An ESR with class `ec` and syndrome `iss` (IL set, as for every A64 instruction).
    pub const fn new(ec: u8, iss: u32) -> Self {
        Self(((ec as u64) << 26) | Self::IL | (iss as u64 & 0x1ff_ffff))
    }

    /// ESR.EC, raw.
    #[inline(always)]
    pub const fn ec(self) -> u8 {
        ((self.0 >> 26) & 0x3f) as u8
    }

    /// Inlined: the EL0 entry decodes the class on the uprobe hit path.
    #[inline]
    pub fn class(self) -> ExceptionClass {
        match self.ec() {
            0x00 => ExceptionClass::Unknown,
            0x15 => ExceptionClass::Svc64,
            0x18 => ExceptionClass::SystemRegisterTrap,
            0x1c => ExceptionClass::PointerAuthFailure,
            0x20 => ExceptionClass::InstructionAbortLowerEl,
            0x21 => ExceptionClass::InstructionAbort,
            0x22 => ExceptionClass::PcAlignment,
            0x24 => ExceptionClass::DataAbortLowerEl,
            0x25 => ExceptionClass::DataAbort,
            0x26 => ExceptionClass::SpAlignment,
            0x2f => ExceptionClass::SError,
            0x32 => ExceptionClass::SoftwareStepLowerEl,
            0x33 => ExceptionClass::SoftwareStep,
            0x3c => ExceptionClass::Brk,
            _ => ExceptionClass::Other,
        }
    }

    /// ESR.ISS.
    pub const fn iss(self) -> u32 {
        (self.0 & 0x1ff_ffff) as u32
    }

    /// The 16-bit immediate of a BRK or SVC (ISS[15:0]; meaningless for other classes).
    #[inline(always)]
    pub const fn immediate(self) -> u16 {
        self.0 as u16
    }

    /// The fault status of an instruction or data abort.
    pub fn fault_status(self) -> FaultStatus {
        FaultStatus::of(self.0)
    }

    /// ISS.WnR of a data abort: the access was a write.
    pub const fn is_write(self) -> bool {
        self.0 & Self::WNR != 0
    }

    /// A data abort as EL0 would have taken it, from one an unprivileged access at EL1 took:
    /// class "data abort from a lower EL", IL, and WnR/DFSC/S1PTW/CM/EA/FnV (ISS[10:0]); ISV
    /// clear.
    pub const fn as_lower_el_data_abort(self) -> Self {
        Self::new(Self::EC_DATA_ABORT_LOWER_EL, (self.0 & 0x7ff) as u32)
    }
}

impl From<u64> for Esr {
    fn from(value: u64) -> Self {
        Self(value)
    }
}
