"""Runs inside a bwrap sandbox as its PID 1 and executes the agent's commands.

Standard library only: it is started with the harness's interpreter in isolated
mode (`python -I -S`), with nothing of mlrb importable. The harness writes one
JSON request per line on its stdin, {"command": str, "timeout_s": float,
"whole_run": bool}, or {"signal": "STOP" | "CONT"}, and reads one JSON reply per line
on its stdout. The first line it writes is {"ready": true}.

Being PID 1 of the sandbox's PID namespace means: processes the agent leaves in
the background keep running between commands (as in a container) and die with
the namespace when the run ends; signals sent from inside the sandbox cannot
kill this process; orphans are reparented here, so it reaps them. It marks
itself non-dumpable, so the agent's processes (same uid) cannot open its /proc
entries, its pipes included.

At a command's timeout every process that command started is killed, detached
ones included; work left running by earlier commands is not. A `whole_run` command
is the agent's whole run (an outside agent's program): when it ends, every other
process of the namespace is killed before the reply, so nothing of the agent works
after its end; the reply names them ("left": their command lines). A signal request
stops (STOP) or resumes (CONT) every other process of the namespace at once: the agent's
processes stand still while the harness's clock does.
SIGUSR2 and SIGUSR1, which only the harness can send it, stop and then kill every other
process at once (a limit the harness enforces from outside, such as the agent's disk): a
command under way returns killed.
kill(-1, ...) from here reaches every process of the namespace but this one, in one
step that no fork can slip past.
"""

import json
import os
import selectors
import signal
import subprocess
import sys
import time

MAX_CAPTURE_BYTES = 1_000_000
PR_SET_DUMPABLE = 4


def make_non_dumpable():
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # hardening only: confinement does not depend on it


def process_table():
    """pid -> parent pid for every live process this namespace shows (zombies are dead
    already: they only wait to be reaped)."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        if fields[0] != "Z":
            table[int(name)] = int(fields[1])
    return table


def command_processes(before):
    """Every live process the command started: those that did not exist when it began and
    do not descend from a process that did (work the agent left running earlier, say a
    training job's new data-loader workers, is spared). A process that detached itself
    (a new session, its parent gone) hangs from this server, so it counts as the command's."""
    table = process_table()
    me = os.getpid()
    found = set()
    for pid in table:
        if pid in before or pid == me:
            continue
        ancestor = table[pid]
        while ancestor in table and ancestor not in before and ancestor != me:
            ancestor = table[ancestor]
        if ancestor == me or ancestor not in before:
            found.add(pid)
    return found


def kill_command(before, leader):
    """SIGKILL until nothing of the command is left (a forking loop keeps making new pids)."""
    for _ in range(50):
        alive = False
        for pid in command_processes(before):
            try:
                os.kill(pid, signal.SIGKILL)
                alive = True
            except (ProcessLookupError, PermissionError):
                pass
        reap_orphans(leader)
        if not alive:
            return
        time.sleep(0.01)


def reap_orphans(keep):
    """Reap every exited child except `keep` (subprocess collects that one itself)."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == keep:
            return
        try:
            os.waitpid(info.si_pid, 0)
        except ChildProcessError:
            pass


def command_lines(pids):
    """The command line of each of PIDS still there."""
    found = []
    for pid in sorted(pids):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                line = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if line:
            found.append(line)
    return found


def end_all_others(leader):
    """SIGKILL every process of the namespace but this one, and reap them (not `leader`,
    which subprocess collects)."""
    for _ in range(50):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:  # nothing left to signal
            break
        reap_orphans(leader)
        time.sleep(0.01)
    reap_orphans(leader)


def signal_all_others(name):
    """STOP or CONT every process of the namespace but this one."""
    try:
        os.kill(-1, {"STOP": signal.SIGSTOP, "CONT": signal.SIGCONT}[name])
    except ProcessLookupError:
        pass
    return {"signalled": name}


def exit_signal(pid):
    """A file descriptor that becomes readable when PID ends (a pidfd), or None where the kernel has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def run(command, timeout_s, cwd, whole_run=False):
    started = time.monotonic()
    before = set(process_table())
    proc = subprocess.Popen(
        ["/bin/bash", "-c", command],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None  # both are pipes
    captured = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    selector = selectors.DefaultSelector()
    for stream in captured:
        os.set_blocking(stream.fileno(), False)
        selector.register(stream, selectors.EVENT_READ, captured[stream])
    exited = exit_signal(proc.pid)  # wakes the loop the moment the command ends (its end may be the agent's)
    if exited is not None:
        selector.register(exited, selectors.EVENT_READ, None)
    deadline = started + timeout_s
    timed_out = False
    while proc.poll() is None:
        reap_orphans(proc.pid)
        if time.monotonic() >= deadline:
            timed_out = True
            kill_command(before, proc.pid)
            proc.wait()
            break
        for key, _ in selector.select(timeout=min(0.05, max(0.0, deadline - time.monotonic()))):
            if key.data is not None:
                drain(key.fileobj, key.data)
    left = []
    if whole_run:  # the agent's run is over: nothing it left may go on (what was, named in the reply)
        proc.wait()
        left = command_lines(set(process_table()) - {os.getpid(), proc.pid})
        end_all_others(proc.pid)
    # What is already written; a background process holding the pipes open is not waited for.
    for stream, buffer in captured.items():
        drain(stream, buffer)
        stream.close()
    selector.close()
    if exited is not None:
        os.close(exited)
    code = proc.returncode
    return {
        "exit_code": 128 - code if code < 0 else code,  # a signal, as a shell reports it
        "stdout": capped(captured[proc.stdout]),
        "stderr": capped(captured[proc.stderr]),
        "duration_s": time.monotonic() - started,
        "timed_out": timed_out,
        "left": left,
    }


def drain(stream, buffer):
    while True:
        try:
            chunk = os.read(stream.fileno(), 65536)
        except (BlockingIOError, OSError):
            return
        if not chunk:
            return
        if len(buffer) <= MAX_CAPTURE_BYTES:
            buffer.extend(chunk)


def capped(data):
    text = bytes(data[:MAX_CAPTURE_BYTES]).decode(errors="replace")
    if len(data) > MAX_CAPTURE_BYTES:
        text += f"\n[... output truncated at {MAX_CAPTURE_BYTES} bytes ...]"
    return text


def stopped_from_outside(signum, frame):
    """SIGUSR2, then SIGUSR1, from the harness (from outside the namespace: nothing inside can send
    them to PID 1): the run is stopping the agent. SIGUSR2 stops every other process where it is,
    SIGUSR1 kills them all; a command under way returns killed, with what it printed, and the
    server answers on (commands are then refused by the harness)."""
    try:
        os.kill(-1, signal.SIGKILL if signum == signal.SIGUSR1 else signal.SIGSTOP)
    except ProcessLookupError:
        pass


def main():
    make_non_dumpable()
    signal.signal(signal.SIGUSR1, stopped_from_outside)
    signal.signal(signal.SIGUSR2, stopped_from_outside)
    cwd = sys.argv[1] if len(sys.argv) > 1 else "/"
    # Requests arrive on fd 0 and replies leave on fd 1; the agent's commands get neither.
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in requests:
        request = json.loads(line)
        if "signal" in request:
            reply = signal_all_others(request["signal"])
        else:
            reply = run(request["command"], float(request["timeout_s"]), cwd, bool(request.get("whole_run")))
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
