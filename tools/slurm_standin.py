"""A stand-in Slurm allocation on one Linux machine, to run deploy/slurm/*.sbatch for real in tests.

Each "node" is a set of Linux namespaces of its own: network (its own address on a bridge, so Ray on two nodes
really talks over IP and `ray symmetric-run` finds its head by address), UTS (its hostname), PID (its own
process table, so `ray stop` or Ray's "already started" check on one node sees only that node) and mount (a
private /tmp, as a compute node's local disk; the job's shared folder is outside /tmp). The whole allocation
lives inside one outer PID namespace: when it ends, the kernel ends every process it started, whatever the
scripts did.

    sbatch(script, args, nodes, shared_dir, env) -> BatchResult     from a test (needs root: unshare, ip)

Inside, `srun`, `scontrol` and `nvidia-smi` are this module's own commands (shims on PATH): `srun` runs a task on
each chosen node (nsenter into its namespaces) with the variables Slurm sets for a step, `scontrol show hostnames`
expands a node list, and `nvidia-smi --query-gpu=compute_cap` answers a node's declared compute capability (the
machine has no GPU; a node without one fails as a driverless node does). An option the scripts use that is not
implemented here is refused, never ignored.

The batch script runs on the first node with the variables sbatch sets (SLURM_JOB_ID, SLURM_JOB_NODELIST,
SLURM_NNODES, SLURM_SUBMIT_DIR, SLURM_CPUS_PER_TASK, ...; #SBATCH lines parsed). When a step's tasks have all
ended, srun kills what they left behind, as Slurm's process tracking does, and logs each. When the script exits,
the processes still alive on each node and in the batch step (a step the script started in the background and
never ended) are recorded (`BatchResult.leftovers`) before the nodes are torn down.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

SUBNET = "10.77.0"  # the bridge is .1, node i is .(10 + i); private to the allocation's network namespace
ENV_STATE = "SPECSWEEP_SLURM_STANDIN_STATE"
STEP_MARK = "SPECSWEEP_SLURM_STANDIN_STEP"  # job.step, inherited by every process a step starts
# A node's PID 1: it adopts every orphan of the node (a daemonised raylet's children, say) and reaps it, as init does
_REAPER = "import os, time\nwhile True:\n    try:\n        os.wait()\n    except ChildProcessError:\n        time.sleep(0.2)"


@dataclass(frozen=True)
class Node:
    name: str
    compute_cap: str | None = None  # "9.0": nvidia-smi answers it; None: a node without NVIDIA GPUs
    gpus: int = 8


@dataclass
class BatchResult:
    returncode: int
    output: str  # the job's output file (#SBATCH --output)
    leftovers: dict[str, list[str]] = field(default_factory=dict)  # node -> "pid cmdline" alive after the script


# ---------------------------------------------------------------------------------------------------------- helpers

def expand_hostlist(text: str) -> list[str]:
    """Slurm's host-list syntax: `node[1-3,5],gpu7` -> node1 node2 node3 node5 gpu7 (zero padding kept)."""
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", text):
        m = re.fullmatch(r"([^\[]+)\[([^\]]+)\]", part)
        if not m:
            out.append(part)
            continue
        prefix, ranges = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                out.append(f"{prefix}{i:0{len(lo)}d}")
    return out


def compress_hostlist(names: list[str]) -> str:
    """The inverse for names of one prefix and unpadded numbers, as Slurm writes SLURM_JOB_NODELIST."""
    found = [re.fullmatch(r"(.*?)(\d+)", n) for n in names]
    m = [x for x in found if x is not None]
    if len(names) > 1 and len(m) == len(names) and len({x.group(1) for x in m}) == 1:
        nums = [x.group(2) for x in m]
        return f"{m[0].group(1)}[{nums[0]}-{nums[-1]}]" if nums == [str(i) for i in range(int(nums[0]),
                                                                                          int(nums[0]) + len(nums))] \
            else f"{m[0].group(1)}[{','.join(nums)}]"
    return ",".join(names)


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def _pidns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")


def _only_child(pid: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except FileNotFoundError:
            kids = []
        if kids:
            return int(kids[0])
        time.sleep(0.02)
    raise RuntimeError(f"process {pid} started no child within {timeout} s")


# ------------------------------------------------------------------------------------------------- the allocation

def sbatch(script: Path, args: list[str], nodes: list[Node], shared_dir: Path, env: dict[str, str],
           job_id: int = 4242, timeout: float = 900) -> BatchResult:
    """Run `script args` as a batch job on `nodes` (the first runs the script); `shared_dir` is the submit
    directory every node sees (keep it outside /tmp, which is each node's own)."""
    if os.geteuid() != 0:
        raise PermissionError("the Slurm stand-in needs root (network, PID and mount namespaces)")
    spec = {"script": str(script.resolve()), "args": args, "nodes": [asdict(n) for n in nodes], "shared": str(shared_dir),
            "env": env, "job_id": job_id, "result": str(shared_dir / f".standin-{job_id}.json")}
    spec_file = shared_dir / f".standin-{job_id}-spec.json"
    spec_file.write_text(json.dumps(spec))
    proc = subprocess.run(["unshare", "--net", "--mount", "--pid", "--fork", "--mount-proc", "--propagation",
                           "private", sys.executable, "-m", "tools.slurm_standin", "_allocation", str(spec_file)],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=timeout)
    result_file = Path(str(spec["result"]))
    if not result_file.is_file():
        raise RuntimeError(f"the stand-in allocation failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    data = json.loads(result_file.read_text())
    return BatchResult(data["returncode"], data["output"], data["leftovers"])


def _allocation(spec_file: str) -> int:
    """PID 1 of the allocation's namespace: network, nodes, the batch script, the record of what it left."""
    spec = json.loads(Path(spec_file).read_text())
    nodes = [Node(**n) for n in spec["nodes"]]
    shared = Path(spec["shared"])
    state_dir = Path(tempfile.mkdtemp(prefix="standin-", dir=shared))
    _run(["ip", "link", "set", "lo", "up"])
    _run(["ip", "link", "add", "br0", "type", "bridge"])
    _run(["ip", "addr", "add", f"{SUBNET}.1/24", "dev", "br0"])
    _run(["ip", "link", "set", "br0", "up"])
    hosts = state_dir / "hosts"
    hosts.write_text("127.0.0.1 localhost\n" + "".join(f"{SUBNET}.{10 + i} {n.name}\n" for i, n in enumerate(nodes)))
    _run(["mount", "--bind", str(hosts), "/etc/hosts"])

    def node_tmp(name: str) -> Path:
        path = state_dir / "tmp" / name  # the node's local /tmp
        path.mkdir(parents=True, exist_ok=True)
        return path

    holders: dict[str, int] = {}
    wrappers: list[int] = []
    for i, node in enumerate(nodes):
        # unshare forks the node's PID 1 (sleep): its namespaces are the node; killing it ends the node
        outer = subprocess.Popen(["unshare", "--net", "--uts", "--pid", "--mount", "--fork", "--mount-proc",
                                  "--propagation", "private", "sh", "-c",
                                  f"hostname {node.name} && mount --bind {node_tmp(node.name)} /tmp && exec {sys.executable} -c '{_REAPER}'"])
        wrappers.append(outer.pid)
        pid = _only_child(outer.pid)
        while _read_hostname(pid) != node.name:
            time.sleep(0.02)
        holders[node.name] = pid
        _run(["ip", "link", "add", f"veth{i}", "type", "veth", "peer", "name", "eth0", "netns", str(pid)])
        _run(["ip", "link", "set", f"veth{i}", "master", "br0", "up"])
        inside = ["nsenter", "-t", str(pid), "--net"]
        _run(inside + ["ip", "link", "set", "lo", "up"])
        _run(inside + ["ip", "addr", "add", f"{SUBNET}.{10 + i}/24", "dev", "eth0"])
        _run(inside + ["ip", "link", "set", "eth0", "up"])
        _run(inside + ["ip", "route", "add", "default", "via", f"{SUBNET}.1"])

    shims = state_dir / "bin"
    shims.mkdir()
    repo = Path(__file__).resolve().parents[1]
    for cmd in ("srun", "scontrol", "nvidia-smi"):
        (shims / cmd).write_text(f"#!/bin/sh\nPYTHONPATH={repo} exec {sys.executable} -m tools.slurm_standin {cmd} \"$@\"\n")
        (shims / cmd).chmod(0o755)
    state = {"nodes": [asdict(n) for n in nodes], "holders": holders, "steps": 0, "job_id": spec["job_id"]}
    state_file = state_dir / "state.json"
    state_file.write_text(json.dumps(state))

    script = Path(spec["script"])
    options = _sbatch_options(script.read_text(), len(nodes))
    job_id = spec["job_id"]
    output = shared / options.get("output", "slurm-%j.out").replace("%j", str(job_id))
    names = [n.name for n in nodes]
    tasks_per_node = int(options.get("ntasks-per-node", "1"))
    env = {**os.environ, **spec["env"], ENV_STATE: str(state_file),
           "PATH": f"{shims}:{spec['env'].get('PATH', os.environ['PATH'])}",
           "SLURM_JOB_ID": str(job_id), "SLURM_JOBID": str(job_id), "SLURM_JOB_NAME": options.get("job-name", script.name),
           "SLURM_JOB_NODELIST": compress_hostlist(names), "SLURM_NODELIST": compress_hostlist(names),
           "SLURM_NNODES": str(len(nodes)), "SLURM_JOB_NUM_NODES": str(len(nodes)),
           "SLURM_NTASKS": str(len(nodes) * tasks_per_node), "SLURM_NPROCS": str(len(nodes) * tasks_per_node),
           "SLURM_NTASKS_PER_NODE": str(tasks_per_node), "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{len(nodes)})",
           "SLURM_SUBMIT_DIR": str(shared), "SLURM_SUBMIT_HOST": socket.gethostname(),
           "SLURM_CLUSTER_NAME": "standin", "SLURM_JOB_PARTITION": "standin",
           "SLURM_JOB_USER": os.environ.get("USER", "root"), "SLURM_JOB_UID": str(os.getuid()),
           "SLURMD_NODENAME": names[0], "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
           "SLURM_CPUS_ON_NODE": str(os.cpu_count() or 1)}
    if "cpus-per-task" in options:
        env["SLURM_CPUS_PER_TASK"] = options["cpus-per-task"]
    if "gpus-per-node" in options:
        env["SLURM_GPUS_PER_NODE"] = options["gpus-per-node"]
    with open(output, "w") as out:
        # The batch step: the first node's network, hostname and /tmp, in the allocation's PID namespace (from
        # where srun reaches every node); the tasks srun starts are in their node's PID namespace.
        batch = subprocess.Popen(["nsenter", "-t", str(holders[names[0]]), "--net", "--uts", "--",
                                  "unshare", "--mount", "--propagation", "private", "sh", "-c",
                                  'mount --bind "$0" /tmp && cd "$1" && shift && exec bash "$@"',
                                  str(node_tmp(names[0])), str(shared), str(script), *spec["args"]],
                                 env=env, stdout=out, stderr=subprocess.STDOUT)
        returncode = batch.wait()
    leftovers = {name: _processes_in(pid) for name, pid in holders.items()}
    leftovers["batch step"] = [p for p in _processes_in(os.getpid())
                               if int(p.split()[0]) not in {*wrappers, *holders.values()}]
    for pid in holders.values():
        os.kill(pid, signal.SIGKILL)
    Path(spec["result"]).write_text(json.dumps({"returncode": returncode, "output": output.read_text(),
                                                "leftovers": leftovers}))
    return 0


def _read_hostname(pid: int) -> str:
    try:
        return subprocess.run(["nsenter", "-t", str(pid), "--uts", "hostname"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except subprocess.CalledProcessError:
        return ""


def _enter(holder: int, cwd: str) -> list[str]:
    return ["nsenter", "-t", str(holder), "--net", "--uts", "--mount", "--pid", f"--wd={cwd}", "--"]


def _processes_in(pid1: int) -> list[str]:
    """Every process of `pid1`'s PID namespace but `pid1` itself ("pid cmdline", pids as the allocation sees them)."""
    ns, found = _pidns(pid1), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (pid1, os.getpid()):
            continue
        try:
            if _pidns(int(entry.name)) == ns and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                found.append(f"{entry.name} {cmdline}")
        except OSError:
            continue
    return found


_SBATCH_KNOWN = {"job-name", "nodes", "ntasks-per-node", "cpus-per-task", "gpus-per-node", "exclusive", "time",
                 "output"}


def _sbatch_options(text: str, nnodes: int) -> dict[str, str]:
    """The script's #SBATCH lines (sbatch stops reading them at the first command)."""
    options: dict[str, str] = {}
    for line in text.splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break
        m = re.match(r"#SBATCH\s+--([\w-]+)(?:=(\S+))?\s*$", line)
        if line.startswith("#SBATCH") and not m:
            raise ValueError(f"#SBATCH line {line!r}: the stand-in reads `#SBATCH --option[=value]` only")
        if m:
            if m.group(1) not in _SBATCH_KNOWN:
                raise ValueError(f"#SBATCH --{m.group(1)}: not implemented by the stand-in; allowed {sorted(_SBATCH_KNOWN)}")
            options[m.group(1)] = m.group(2) or ""
    if options.get("nodes", str(nnodes)) != str(nnodes):
        raise ValueError(f"#SBATCH --nodes={options['nodes']}: the stand-in allocation has {nnodes} node(s)")
    return options


# ------------------------------------------------------------------------------------------------ the shims inside

def _state() -> tuple[dict, Path]:
    path = Path(os.environ[ENV_STATE])
    with open(path) as f:
        fcntl.flock(f, fcntl.LOCK_SH)  # never a half-written file while another srun counts its step
        return json.load(f), path


def _next_step(path: Path) -> int:
    with open(path, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        state = json.load(f)
        step = state["steps"]
        state["steps"] = step + 1
        f.seek(0)
        f.truncate()
        json.dump(state, f)
    return step


def srun(argv: list[str]) -> int:
    """A job step: the command once per task on the chosen nodes, Slurm's step variables set; exit = the highest
    task exit status. SIGTERM/SIGINT are passed to every task, as srun forwards them."""
    p = argparse.ArgumentParser(prog="srun", allow_abbrev=False)
    p.add_argument("-N", "--nodes", type=int)
    p.add_argument("-n", "--ntasks", type=int)
    p.add_argument("--ntasks-per-node", type=int)
    p.add_argument("-w", "--nodelist")
    p.add_argument("-W", "--wait", type=int, default=0)
    p.add_argument("--overlap", action="store_true")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if not a.command:
        p.error("no command")
    state, path = _state()
    job_nodes = [n["name"] for n in state["nodes"]]
    chosen = expand_hostlist(a.nodelist) if a.nodelist else job_nodes[: a.nodes or len(job_nodes)]
    if unknown := [n for n in chosen if n not in job_nodes]:
        p.error(f"--nodelist {a.nodelist}: {unknown} not in the allocation {job_nodes}")
    if a.nodes and a.nodes != len(chosen):
        p.error(f"--nodes={a.nodes} but --nodelist names {len(chosen)} node(s)")
    per_node = a.ntasks_per_node or max(1, (a.ntasks or len(chosen)) // len(chosen))
    if a.ntasks and a.ntasks != per_node * len(chosen):
        p.error(f"--ntasks={a.ntasks} over {len(chosen)} node(s): the stand-in places the same count on each")
    step = _next_step(path)
    ntasks = per_node * len(chosen)
    tasks: list[subprocess.Popen] = []
    rank = 0
    for name in chosen:
        for local in range(per_node):
            env = {**os.environ, STEP_MARK: f"{state['job_id']}.{step}", "SLURM_STEP_ID": str(step), "SLURM_STEPID": str(step), "SLURM_PROCID": str(rank),
                   "SLURM_LOCALID": str(local), "SLURM_NODEID": str(job_nodes.index(name)),
                   "SLURMD_NODENAME": name, "SLURM_STEP_NODELIST": compress_hostlist(chosen),
                   "SLURM_STEP_NUM_NODES": str(len(chosen)), "SLURM_STEP_NUM_TASKS": str(ntasks),
                   "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks)}
            tasks.append(subprocess.Popen(_enter(state["holders"][name], os.getcwd()) + a.command, env=env))
            rank += 1

    def forward(signum, _frame):
        for t in tasks:
            _signal_task(t, signum)
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    first_done: float | None = None
    while any(t.poll() is None for t in tasks):
        if first_done is None and any(t.poll() is not None for t in tasks):
            first_done = time.monotonic()
        if a.wait and first_done is not None and time.monotonic() - first_done > a.wait:
            log.warning("srun: step %d: a task ended %d s ago; terminating the rest (--wait)", step, a.wait)
            for t in tasks:
                _signal_task(t, signal.SIGTERM)
            first_done = float("inf")
        time.sleep(0.2)
    _end_step(f"{state['job_id']}.{step}", [state["holders"][n] for n in chosen])
    return max(t.returncode if t.returncode >= 0 else 128 - t.returncode for t in tasks)


def _end_step(mark: str, holders: list[int], grace: float = 5.0) -> None:
    """What Slurm's process tracking does when a step's tasks have ended: every process the step started that is
    still alive (found by the variable each inherits, as Slurm finds them by cgroup) is killed, after `grace`
    seconds to exit by itself. Each is logged: the job's output shows what a script left to this cleanup."""
    namespaces = {_pidns(h) for h in holders}

    def remaining() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if (entry.name.isdigit() and _pidns(int(entry.name)) in namespaces
                        and f"{STEP_MARK}={mark}".encode() in (entry / "environ").read_bytes().split(b"\0")):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    deadline = time.monotonic() + grace
    while (pids := remaining()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
            os.kill(pid, signal.SIGKILL)
            log.warning("srun: step %s ended; killed pid %d left by it: %s", mark, pid, cmdline)
        except (OSError, ProcessLookupError):
            continue


def _signal_task(task: subprocess.Popen, signum: int) -> None:
    """nsenter forks the task inside the node's PID namespace; the signal goes to that child."""
    if task.poll() is not None:
        return
    try:
        os.kill(_only_child(task.pid, timeout=2), signum)
    except (RuntimeError, ProcessLookupError):
        pass


def scontrol(argv: list[str]) -> int:
    if argv[:2] != ["show", "hostnames"] or len(argv) > 3:
        sys.exit(f"scontrol {' '.join(argv)}: the stand-in implements `scontrol show hostnames [LIST]` only")
    print("\n".join(expand_hostlist(argv[2] if len(argv) == 3 else os.environ["SLURM_JOB_NODELIST"])))
    return 0


def nvidia_smi(argv: list[str]) -> int:
    if sorted(argv) != ["--format=csv,noheader", "--query-gpu=compute_cap"]:
        sys.exit(f"nvidia-smi {' '.join(argv)}: the stand-in answers --query-gpu=compute_cap --format=csv,noheader only")
    state, _ = _state()
    node = next(n for n in state["nodes"] if n["name"] == socket.gethostname())
    if node["compute_cap"] is None:
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
        return 9
    print("\n".join([node["compute_cap"]] * node["gpus"]))
    return 0


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `scontrol show hostnames | head -n 1`, as the real command
    cmd, rest = argv[0], argv[1:]
    if cmd == "_allocation":
        return _allocation(rest[0])
    return {"srun": srun, "scontrol": scontrol, "nvidia-smi": nvidia_smi}[cmd](rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
