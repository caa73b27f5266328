#!/usr/bin/env python3
"""Where the SIGPROF handler's panic paths are, in a built handler-proof binary.

The link-time proof (`--features check`) only says that `handle_signal` has a panic path
somewhere in its reach. This lists every call to a panic entry point (`core::panicking::*`,
`unwrap_failed`, bounds and slice-index failures, ...) in the functions reachable from the
handler, with the inlined source locations of each call, so the one that failed the proof
can be found. Build the binary without the check (it would not link) and with line tables:

    CARGO_PROFILE_HANDLER_PROOF_DEBUG=line-tables-only \
      cargo build -p otel-profiling-handler-proof --profile handler-proof
    bridge/handler-proof/panic-paths.py target/handler-proof/otel-profiling-handler-proof

Calls that cannot unwind (`panic_nounwind*`,
`panic_cannot_unwind`, the pointer checks: std's precondition checks in a build with debug
assertions, the `extern "C"` boundaries' abort) are listed apart: the proof does not see
them. A diagnostic for people (x86_64, binutils' `objdump` and `addr2line`); CI does not
run it.
"""

import collections
import re
import subprocess
import sys

ENTRY = "otel_profiling::sampler::handler::on_sigprof"
PANICS = re.compile(
    r"core::panicking::|std::panicking::|unwrap_failed|expect_failed|slice_(start_|end_)?index"
    r"|index_order_fail|str_index_overflow|capacity_overflow|handle_alloc_error|handle_error"
    r"|panic_already_(mutably_)?borrowed|_Unwind_Resume"
)
# Panics that abort without unwinding (checked first: they are `core::panicking` too).
NOUNWIND = re.compile(
    r"panic_nounwind|panic_cannot_unwind|panic_in_cleanup"
    r"|panic_misaligned_pointer_dereference|panic_null_pointer_dereference"
)
HEADER = re.compile(r"^[0-9a-f]+ <(.*)>:$")
INSTRUCTION = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")
TARGET = re.compile(r"[0-9a-f]+ <(.+?)(\+0x[0-9a-f]+)?>$")


def functions(binary):
    """Each function's direct calls and tail jumps: name -> [(address, callee)]."""
    dump = subprocess.run(
        ["objdump", "-d", "-C", "-w", "--no-show-raw-insn", binary],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    calls = collections.defaultdict(list)
    current = None
    for line in dump.splitlines():
        header = HEADER.match(line)
        if header:
            current = header.group(1)
            calls[current]
            continue
        instruction = INSTRUCTION.match(line)
        if current is None or not instruction:
            continue
        address, op, operand = instruction.groups()
        target = TARGET.search(operand)
        if not target or target.group(1) == current:
            continue
        # A call, or a jump to another function's start (a tail call).
        if op.startswith("call") or (op.startswith("j") and target.group(2) is None):
            calls[current].append((address, target.group(1)))
    return calls


def inlined_at(binary, address):
    """The source locations of one instruction, innermost first."""
    out = subprocess.run(
        ["addr2line", "-i", "-C", "-e", binary, "0x" + address],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [re.sub(r"^.*/(registry/src/[^/]+/|rustc/[0-9a-f]+/)", "", l) for l in out.split()]


def main():
    args = sys.argv[1:]
    if len(args) != 1:
        sys.exit(__doc__)
    binary = args[0]
    calls = functions(binary)
    if ENTRY not in calls:
        sys.exit(f"{ENTRY} is not in {binary}")
    seen, queue = {ENTRY}, collections.deque([ENTRY])
    while queue:
        function = queue.popleft()
        if PANICS.search(function) or NOUNWIND.search(function):
            continue
        for _, callee in calls[function]:
            if callee not in seen:
                seen.add(callee)
                queue.append(callee)
    found = {"unwinding": 0, "not unwinding": 0}
    for function in sorted(seen):
        if PANICS.search(function) or NOUNWIND.search(function):
            continue
        for address, callee in calls[function]:
            kind = "not unwinding" if NOUNWIND.search(callee) else "unwinding"
            if not (PANICS.search(callee) or NOUNWIND.search(callee)):
                continue
            found[kind] += 1
            print(f"{kind}: {callee.split('::')[-1]} in {function} at 0x{address}")
            for location in inlined_at(binary, address):
                print(f"    {location}")
    print(
        f"{found['unwinding']} panic call(s) that unwind (the proof fails on these), "
        f"{found['not unwinding']} that cannot unwind, in {len(seen)} reachable functions"
    )


if __name__ == "__main__":
    main()
