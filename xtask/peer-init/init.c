/* The init of the Linux peer: checks facts, times Linux's probes and tracers, powers off.
 *
 * Built by `cargo xtask peer linux` with Debian's aarch64-linux-gnu-gcc, static glibc, and
 * packed as /init of an initramfs. It speaks the line protocol that xtask/src/peer/protocol.rs
 * parses, one record a line on the console, every line starting with "peer 1 ":
 *
 *   peer 1 fact NAME VALUE...       something checked in the guest (uname, a sysfs file,
 *                                   depth.CASE: the frames of a stack trace row's traces)
 *   peer 1 row CASE tracing_on=T iterations=N base=B probed=P hits=H
 *                                   one measurement: B and P are the minimum over the
 *                                   repetitions of N iterations' CNTVCT ticks without and with
 *                                   the mechanism, H the hits Linux counted over all of them
 *   peer 1 begin RELEASE            the first line, before the guest idles
 *   peer 1 error TEXT               a step failed (the run counts for nothing)
 *   peer 1 end failures=N           the last line of a run that finished
 *
 * Everything else on the console (the kernel's own log) is ignored by xtask.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#define TRACEFS "/sys/kernel/tracing"
/* The kernel function the loop reaches: getppid is the cheapest syscall whose handler is a
 * real, traceable function (getpid's is too, but kept as the "unrelated" site below). */
#define KERNEL_TARGET "__arm64_sys_getppid"
#define UNRELATED_TARGET "__arm64_sys_getpid"
#define ITERATIONS 1000
/* HZ=250 at 1 GHz: a tick every 4 M instructions. Ten repetitions of the cheapest loop
 * (0.5 M) span more than a tick period, so their minimum is one that no tick hit. */
#define REPETITIONS 10

static int failures;

static void line(const char *kind, const char *format, ...)
{
	char text[1024];
	va_list args;
	va_start(args, format);
	vsnprintf(text, sizeof text, format, args);
	va_end(args);
	/* One write a line, so that the kernel's own console output cannot split it. */
	dprintf(1, "peer 1 %s %s\n", kind, text);
}

#define error(...) (failures++, line("error", __VA_ARGS__))

/* The virtual counter: EL0 may read it on Linux (CNTKCTL_EL1.EL0VCTEN). The ISB keeps the
 * read from moving across the loop it times. */
static inline uint64_t counter(void)
{
	uint64_t value;
	__asm__ volatile("isb\n\tmrs %0, cntvct_el0" : "=r"(value)::"memory");
	return value;
}

static uint64_t counter_frequency(void)
{
	uint64_t value;
	__asm__ volatile("mrs %0, cntfrq_el0" : "=r"(value));
	return value;
}

static int write_file(const char *path, const char *text, int append)
{
	int fd = open(path, O_WRONLY | (append ? O_APPEND : O_TRUNC));
	if (fd < 0) {
		error("open %s: %s", path, strerror(errno));
		return -1;
	}
	ssize_t length = strlen(text);
	ssize_t written = write(fd, text, length);
	if (written != length) {
		error("write '%s' to %s: %s", text, path, strerror(errno));
		close(fd);
		return -1;
	}
	close(fd);
	return 0;
}

static int tracefs(const char *file, const char *text)
{
	char path[256];
	snprintf(path, sizeof path, TRACEFS "/%s", file);
	return write_file(path, text, 0);
}

static int tracefs_append(const char *file, const char *text)
{
	char path[256];
	snprintf(path, sizeof path, TRACEFS "/%s", file);
	return write_file(path, text, 1);
}

/* A whole small file, NUL-terminated, trailing newline removed; "" when unreadable. */
static const char *read_file(const char *path)
{
	static char text[65536];
	text[0] = 0;
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return text;
	ssize_t total = 0, got;
	while (total < (ssize_t)sizeof text - 1 && (got = read(fd, text + total, sizeof text - 1 - total)) > 0)
		total += got;
	close(fd);
	text[total] = 0;
	while (total > 0 && text[total - 1] == '\n')
		text[--total] = 0;
	return text;
}

/* ---- the timed loops ---- */

/* getppid by a raw `svc`: the loop holds the syscall entry and exit and nothing of glibc. */
static uint64_t kernel_loop(void)
{
	uint64_t start = counter();
	for (int i = 0; i < ITERATIONS; i++) {
		register long number __asm__("x8") = __NR_getppid;
		register long result __asm__("x0");
		__asm__ volatile("svc #0" : "=r"(result) : "r"(number) : "memory");
	}
	return counter() - start;
}

/* fstat by a raw `svc` on a file of the initramfs: a deeper path (the VFS's getattr) than
 * getppid's, for stack traces taken further from the syscall entry. */
static int stat_fd = -1;

static uint64_t stat_loop(void)
{
	struct stat buffer;
	uint64_t start = counter();
	for (int i = 0; i < ITERATIONS; i++) {
		register long number __asm__("x8") = __NR_fstat;
		register long fd __asm__("x0") = stat_fd;
		register struct stat *out __asm__("x1") = &buffer;
		__asm__ volatile("svc #0" : "+r"(fd) : "r"(number), "r"(out) : "memory");
	}
	return counter() - start;
}

/* The user targets, each named for its first instruction (the one a uprobe replaces). */
__asm__(".text\n"
	".balign 16\n"
	".globl target_nop\n"
	"target_nop:\n"
	"	nop\n"
	"	ret\n"
	".balign 16\n"
	".globl target_push\n"
	"target_push:\n"
	"	stp x29, x30, [sp, #-16]!\n"
	"	mov x29, sp\n"
	"	ldp x29, x30, [sp], #16\n"
	"	ret\n"
	".balign 16\n"
	".globl target_ret\n"
	"target_ret:\n"
	"	ret\n");
void target_nop(void);
void target_push(void);
void target_ret(void);

/* Called through a pointer the compiler cannot see through: the call stays in the loop. */
static void (*volatile user_target)(void);

static uint64_t user_loop(void)
{
	void (*target)(void) = user_target;
	uint64_t start = counter();
	for (int i = 0; i < ITERATIONS; i++)
		target();
	return counter() - start;
}

static uint64_t minimum(uint64_t (*loop)(void))
{
	uint64_t best = UINT64_MAX;
	for (int i = 0; i < REPETITIONS; i++) {
		uint64_t ticks = loop();
		if (ticks < best)
			best = ticks;
	}
	return best;
}

/* ---- hit counters ---- */

/* `kprobe_profile`: "EVENT HITS MISSES" a line; `uprobe_profile`: "PATH EVENT HITS". */
static long profile_hits(const char *file, const char *event)
{
	char path[256];
	snprintf(path, sizeof path, TRACEFS "/%s", file);
	const char *text = read_file(path);
	char copy[65536];
	snprintf(copy, sizeof copy, "%s", text);
	for (char *save = NULL, *entry = strtok_r(copy, "\n", &save); entry; entry = strtok_r(NULL, "\n", &save)) {
		char *words[4] = { 0 };
		int count = 0;
		for (char *inner = NULL, *word = strtok_r(entry, " \t", &inner); word && count < 4;
		     word = strtok_r(NULL, " \t", &inner))
			words[count++] = word;
		if (count == 3 && strcmp(file, "kprobe_profile") == 0 && strcmp(words[0], event) == 0)
			return atol(words[1]);
		if (count == 3 && strcmp(file, "uprobe_profile") == 0 && strcmp(words[1], event) == 0)
			return atol(words[2]);
	}
	error("no %s line for %s", file, event);
	return -1;
}

/* Events committed to the ring buffer of `instance` ("" for the top level), all CPUs:
 * the sum of `per_cpu/cpuN/stats`' "entries:" plus "overrun:" (none expected). */
static long ring_events(const char *instance)
{
	long total = 0;
	for (int cpu = 0; cpu < 64; cpu++) {
		char path[256];
		snprintf(path, sizeof path, TRACEFS "/%s%sper_cpu/cpu%d/stats", instance, *instance ? "/" : "", cpu);
		if (access(path, R_OK) != 0)
			break;
		const char *text = read_file(path);
		const char *entries = strstr(text, "entries: ");
		const char *overrun = strstr(text, "overrun: ");
		if (entries)
			total += atol(entries + 9);
		if (overrun && atol(overrun + 9) != 0)
			error("%s cpu%d overran its ring buffer", *instance ? instance : "top level", cpu);
	}
	return total;
}

/* ---- the measurements ---- */

static void row(const char *name, int tracing_on, uint64_t base, uint64_t probed, long hits)
{
	line("row", "%s tracing_on=%d iterations=%d repetitions=%d base=%lu probed=%lu hits=%ld", name, tracing_on,
	     ITERATIONS, REPETITIONS, (unsigned long)base, (unsigned long)probed, hits);
}

/* One kprobe event (`p` or `r`) on the kernel target, timed with tracing_on 1 then 0. */
static void kernel_probe(const char *kind, const char *name)
{
	char definition[128], enable[128];
	snprintf(definition, sizeof definition, "%s:kprobes/%s " KERNEL_TARGET, kind, name);
	snprintf(enable, sizeof enable, "events/kprobes/%s/enable", name);
	if (tracefs_append("kprobe_events", definition) != 0)
		return;
	for (int on = 1; on >= 0; on--) {
		tracefs("tracing_on", on ? "1" : "0");
		uint64_t base = minimum(kernel_loop);
		tracefs(enable, "1");
		long before = profile_hits("kprobe_profile", name);
		uint64_t probed = minimum(kernel_loop);
		long hits = profile_hits("kprobe_profile", name) - before;
		tracefs(enable, "0");
		row(name, on, base, probed, hits);
	}
	tracefs("trace", "");
	tracefs("kprobe_events", "");
}

/* The file offset of `address` in /init: the uprobe's `PATH:OFFSET`. */
static unsigned long file_offset(void (*function)(void))
{
	unsigned long address = (unsigned long)function;
	const Elf64_Phdr *headers = (const Elf64_Phdr *)getauxval(AT_PHDR);
	unsigned long count = getauxval(AT_PHNUM);
	for (unsigned long i = 0; i < count; i++) {
		const Elf64_Phdr *header = &headers[i];
		if (header->p_type == PT_LOAD && address >= header->p_vaddr &&
		    address < header->p_vaddr + header->p_filesz)
			return address - header->p_vaddr + header->p_offset;
	}
	error("no PT_LOAD segment holds %#lx", address);
	return 0;
}

/* `name` is the row; the event is named `event` (tracefs takes letters, digits and '_'). */
static void user_probe(const char *kind, const char *name, const char *event, void (*target)(void))
{
	char definition[128], enable[128];
	snprintf(definition, sizeof definition, "%s:uprobes/%s /init:%#lx", kind, event, file_offset(target));
	snprintf(enable, sizeof enable, "events/uprobes/%s/enable", event);
	if (tracefs_append("uprobe_events", definition) != 0)
		return;
	user_target = target;
	for (int on = 1; on >= 0; on--) {
		tracefs("tracing_on", on ? "1" : "0");
		uint64_t base = minimum(user_loop);
		tracefs(enable, "1");
		long before = profile_hits("uprobe_profile", event);
		uint64_t probed = minimum(user_loop);
		long hits = profile_hits("uprobe_profile", event) - before;
		tracefs(enable, "0");
		row(name, on, base, probed, hits);
	}
	tracefs("trace", "");
	tracefs("uprobe_events", "");
}

/* The function tracer on the kernel target in the top-level instance, with `other` (an
 * instance's function tracer on `other_filter`, or none): hits are the committed events. */
static void function_tracer(const char *name, const char *tracer, const char *other_filter)
{
	if (other_filter && mkdir(TRACEFS "/instances/peer", 0755) != 0 && errno != EEXIST) {
		error("mkdir instances/peer: %s", strerror(errno));
		return;
	}
	tracefs("set_ftrace_filter", KERNEL_TARGET);
	for (int on = 1; on >= 0; on--) {
		tracefs("tracing_on", on ? "1" : "0");
		/* The base loop has no tracer at all; the probed one has both. */
		uint64_t base = minimum(kernel_loop);
		if (other_filter) {
			/* The instance records nothing (its tracing_on 0): it only adds its ops. */
			tracefs("instances/peer/tracing_on", "0");
			tracefs("instances/peer/set_ftrace_filter", other_filter);
			tracefs("instances/peer/current_tracer", "function");
		}
		tracefs("trace", "");
		tracefs("current_tracer", tracer);
		uint64_t probed = minimum(kernel_loop);
		/* function_graph records an entry and a return per call. */
		long events = ring_events("");
		tracefs("current_tracer", "nop");
		if (other_filter)
			tracefs("instances/peer/current_tracer", "nop");
		long hits = strcmp(tracer, "function_graph") == 0 ? events / 2 : events;
		/* With tracing_on 0 nothing is committed: hits are checked with 1 only. */
		row(name, on, base, probed, on ? hits : -1);
	}
	tracefs("trace", "");
	tracefs("set_ftrace_filter", "");
	if (other_filter && rmdir(TRACEFS "/instances/peer") != 0)
		error("rmdir instances/peer: %s", strerror(errno));
}

/* The frames of the first stack trace in the top-level buffer: its " => " lines. */
static int stack_depth(void)
{
	const char *text = read_file(TRACEFS "/trace");
	const char *start = strstr(text, "<stack trace>");
	if (!start) {
		error("no <stack trace> in the trace");
		return -1;
	}
	int frames = 0;
	for (const char *next = strchr(start, '\n'); next && strncmp(next + 1, " => ", 4) == 0;
	     next = strchr(next + 1, '\n'))
		frames++;
	return frames;
}

/* A stack trace per hit of the function tracer at `function`, a frame deeper each step. */
static void stack_trace(const char *name, const char *function, uint64_t (*kernel_loop)(void))
{
	tracefs("options/func_stack_trace", "0");
	tracefs("set_ftrace_filter", function);
	for (int on = 1; on >= 0; on--) {
		tracefs("tracing_on", on ? "1" : "0");
		tracefs("trace", "");
		tracefs("current_tracer", "function");
		uint64_t base = minimum(kernel_loop);
		/* Only the stack trace differs between the two loops: the function event is in both. */
		tracefs("options/func_stack_trace", "1");
		tracefs("trace", "");
		uint64_t probed = minimum(kernel_loop);
		long events = ring_events("");
		if (on)
			line("fact", "depth.%s %d", name, stack_depth());
		tracefs("options/func_stack_trace", "0");
		tracefs("current_tracer", "nop");
		/* A function event and a stack event per hit. */
		row(name, on, base, probed, on ? events / 2 : -1);
	}
	tracefs("trace", "");
	tracefs("set_ftrace_filter", "");
}

/* A kernel symbol's address from /proc/kallsyms: the events plugin counts exceptions at the
 * vector table's entries, and under `nokaslr` the address is the same every boot. */
static void symbol_fact(const char *symbol)
{
	FILE *file = fopen("/proc/kallsyms", "r");
	if (!file) {
		error("open /proc/kallsyms: %s", strerror(errno));
		return;
	}
	char entry[512], address[32], type[8], name[256];
	while (fgets(entry, sizeof entry, file)) {
		if (sscanf(entry, "%31s %7s %255s", address, type, name) == 3 && strcmp(name, symbol) == 0) {
			line("fact", "symbol.%s 0x%s", symbol, address);
			fclose(file);
			return;
		}
	}
	fclose(file);
	error("no %s in /proc/kallsyms", symbol);
}

static void facts(void)
{
	struct utsname name;
	if (uname(&name) == 0) {
		line("fact", "release %s", name.release);
		line("fact", "version %s", name.version);
		line("fact", "machine %s", name.machine);
	}
	line("fact", "cntfrq %lu", (unsigned long)counter_frequency());
	line("fact", "cmdline %s", read_file("/proc/cmdline"));
	static const char *vulnerabilities[] = { "meltdown", "spectre_v1", "spectre_v2", "spec_store_bypass",
						 "spectre_bhb" };
	for (unsigned i = 0; i < sizeof vulnerabilities / sizeof *vulnerabilities; i++) {
		char path[128];
		snprintf(path, sizeof path, "/sys/devices/system/cpu/vulnerabilities/%s", vulnerabilities[i]);
		line("fact", "vulnerability.%s %s", vulnerabilities[i], read_file(path));
	}
	const char *cpuinfo = read_file("/proc/cpuinfo");
	const char *features = strstr(cpuinfo, "Features\t: ");
	if (features) {
		char list[1024];
		size_t length = strcspn(features + 11, "\n");
		snprintf(list, sizeof list, "%.*s", (int)(length < sizeof list - 1 ? length : sizeof list - 1), features + 11);
		line("fact", "cpu.features %s", list);
	}
	line("fact", "tracers %s", read_file(TRACEFS "/available_tracers"));
	symbol_fact("vectors");
}

/* ---- the allocation trace: a short workload under the kmem events, then the buffer out ---- */

/* One worker: a file written, read back and removed, and a pipe's round trips with a child. */
static void worker(int index)
{
	char path[64], buffer[4096];
	snprintf(path, sizeof path, "/tmp/file%d", index);
	memset(buffer, 'a' + index % 26, sizeof buffer);
	for (int round = 0; round < 4; round++) {
		int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0644);
		if (fd < 0)
			_exit(1);
		for (int block = 0; block < 16; block++)
			if (write(fd, buffer, sizeof buffer) != (ssize_t)sizeof buffer)
				_exit(1);
		lseek(fd, 0, SEEK_SET);
		while (read(fd, buffer, sizeof buffer) > 0) {
		}
		close(fd);
		unlink(path);
	}
	int to_child[2], to_parent[2];
	if (pipe(to_child) != 0 || pipe(to_parent) != 0)
		_exit(1);
	pid_t child = fork();
	if (child == 0) {
		char byte;
		while (read(to_child[0], &byte, 1) == 1 && byte != 'q')
			if (write(to_parent[1], &byte, 1) != 1)
				_exit(1);
		_exit(0);
	}
	for (int trip = 0; trip < 64; trip++) {
		char byte = 'x';
		if (write(to_child[1], &byte, 1) != 1 || read(to_parent[0], &byte, 1) != 1)
			_exit(1);
	}
	if (write(to_child[1], "q", 1) != 1)
		_exit(1);
	waitpid(child, NULL, 0);
	_exit(0);
}

/* Processes (fork, exec of /init as a worker, exit), files on a tmpfs, pipes, on every CPU. */
static void workload(void)
{
	mkdir("/tmp", 01777);
	if (mount("tmpfs", "/tmp", "tmpfs", 0, NULL) != 0)
		error("mount tmpfs: %s", strerror(errno));
	enum { WORKERS = 16 };
	pid_t children[WORKERS];
	for (int index = 0; index < WORKERS; index++) {
		children[index] = fork();
		if (children[index] == 0) {
			char argument[16];
			snprintf(argument, sizeof argument, "%d", index);
			execl("/init", "/init", "worker", argument, (char *)NULL);
			_exit(127);
		}
	}
	for (int index = 0; index < WORKERS; index++) {
		int status = 0;
		if (children[index] < 0 || waitpid(children[index], &status, 0) < 0 || !WIFEXITED(status) ||
		    WEXITSTATUS(status) != 0)
			error("worker %d failed (status %#x)", index, status);
	}
	umount("/tmp");
}

/* The per-CPU ring buffers' counters, which must all be 0 for the trace to be whole. */
static void buffer_facts(void)
{
	for (int cpu = 0; cpu < 64; cpu++) {
		char path[128];
		snprintf(path, sizeof path, TRACEFS "/per_cpu/cpu%d/stats", cpu);
		if (access(path, R_OK) != 0)
			break;
		const char *text = read_file(path);
		static const char *counters[] = { "entries", "overrun", "commit overrun", "dropped events" };
		for (unsigned i = 0; i < sizeof counters / sizeof *counters; i++) {
			char key[40];
			snprintf(key, sizeof key, "%s: ", counters[i]);
			const char *at = strstr(text, key);
			char name[40];
			snprintf(name, sizeof name, "%s", counters[i]);
			for (char *c = name; *c; c++)
				if (*c == ' ')
					*c = '_';
			line("fact", "cpu%d.%s %ld", cpu, name, at ? atol(at + strlen(key)) : -1L);
		}
	}
}

/* virtio_blk from the package (compressed as Debian ships it; the kernel decompresses). */
static int load_module(const char *path)
{
	int fd = open(path, O_RDONLY);
	if (fd < 0) {
		error("open %s: %s", path, strerror(errno));
		return -1;
	}
	/* MODULE_INIT_COMPRESSED_FILE: 4. */
	long result = syscall(__NR_finit_module, fd, "", 4);
	close(fd);
	if (result != 0 && errno != EEXIST) {
		error("finit_module %s: %s", path, strerror(errno));
		return -1;
	}
	return 0;
}

/* The whole `trace` file to the disk /dev/vda, then a NUL: the host reads it up to there. */
static void trace_out(void)
{
	if (load_module("/virtio_blk.ko.xz") != 0)
		return;
	int disk = -1;
	for (int wait = 0; wait < 100 && disk < 0; wait++) {
		disk = open("/dev/vda", O_WRONLY);
		if (disk < 0)
			usleep(100000);
	}
	if (disk < 0) {
		error("open /dev/vda: %s", strerror(errno));
		return;
	}
	int trace = open(TRACEFS "/trace", O_RDONLY);
	if (trace < 0) {
		error("open trace: %s", strerror(errno));
		return;
	}
	static char buffer[1 << 20];
	ssize_t got;
	unsigned long total = 0;
	uint64_t start = counter();
	while ((got = read(trace, buffer, sizeof buffer)) > 0) {
		if (write(disk, buffer, got) != got) {
			error("write /dev/vda: %s", strerror(errno));
			return;
		}
		total += got;
	}
	if (write(disk, "", 1) != 1 || fsync(disk) != 0)
		error("finish /dev/vda: %s", strerror(errno));
	close(trace);
	close(disk);
	line("fact", "transport.bytes %lu", total);
	line("fact", "transport.ticks %lu", (unsigned long)(counter() - start));
}

static void allocation_trace(void)
{
	if (mount("devtmpfs", "/dev", "devtmpfs", 0, NULL) != 0)
		error("mount devtmpfs: %s", strerror(errno));
	line("fact", "cmdline %s", read_file("/proc/cmdline"));
	line("fact", "cpus %ld", sysconf(_SC_NPROCESSORS_ONLN));
	line("fact", "counter.workload_start %lu", (unsigned long)counter());
	workload();
	tracefs("tracing_on", "0");
	line("fact", "counter.workload_end %lu", (unsigned long)counter());
	buffer_facts();
	trace_out();
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "worker") == 0)
		worker(atoi(argv[2]));
	mount("proc", "/proc", "proc", 0, NULL);
	mount("sysfs", "/sys", "sysfs", 0, NULL);
	if (mount("tracefs", TRACEFS, "tracefs", 0, NULL) != 0)
		error("mount tracefs: %s", strerror(errno));
	line("begin", "%s", read_file("/proc/sys/kernel/osrelease"));
	/* `-- alloc` on the kernel command line: the allocation trace instead of the timings. */
	if (argc == 2 && strcmp(argv[1], "alloc") == 0) {
		allocation_trace();
		line("end", "failures=%d", failures);
		sync();
		reboot(RB_POWER_OFF);
		return 0;
	}
	/* Boot leaves work behind (deferred initcalls, kworkers) that would land in the first
	 * loops; idling is free under -icount sleep=off. */
	sleep(5);
	facts();
	tracefs("buffer_size_kb", "4096");
	kernel_probe("p", "kprobe");
	kernel_probe("r", "kretprobe");
	function_tracer("ftrace-one-ops", "function", NULL);
	function_tracer("ftrace-unrelated-ops", "function", UNRELATED_TARGET);
	function_tracer("ftrace-two-ops", "function", KERNEL_TARGET);
	user_probe("p", "uprobe-nop", "uprobe_nop", target_nop);
	user_probe("p", "uprobe-push", "uprobe_push", target_push);
	user_probe("p", "uprobe-ret", "uprobe_ret", target_ret);
	user_probe("r", "uretprobe-nop", "uretprobe_nop", target_nop);
	user_probe("r", "uretprobe-push", "uretprobe_push", target_push);
	user_probe("r", "uretprobe-ret", "uretprobe_ret", target_ret);
	/* Stack traces before function_graph, which leaves state behind that makes them dearer. */
	/* The syscall handler and the function it calls, a frame deeper (pid_nr_ns, deeper still,
	 * is inlined; invoke_syscall, shallower, is reached by the tracefs writes too). */
	stack_trace("stacktrace-getppid", KERNEL_TARGET, kernel_loop);
	stack_trace("stacktrace-task-pid-nr-ns", "__task_pid_nr_ns", kernel_loop);
	/* Deeper: fstat's path through the VFS. */
	stat_fd = open("/init", O_RDONLY);
	if (stat_fd < 0)
		error("open /init: %s", strerror(errno));
	stack_trace("stacktrace-vfs-fstat", "vfs_fstat", stat_loop);
	stack_trace("stacktrace-vfs-getattr-nosec", "vfs_getattr_nosec", stat_loop);
	stack_trace("stacktrace-generic-fillattr", "generic_fillattr", stat_loop);
	function_tracer("ftrace-graph", "function_graph", NULL);
	line("end", "failures=%d", failures);
	sync();
	reboot(RB_POWER_OFF);
	return 0;
}
