"""Build the triage corpus scenarios that cannot be captured on this machine (no GPU, no
NCCL, no InfiniBand, no Slurm, no NVIDIA driver).

Every message line is written from the message format in the emitting software's own source
or documentation; the reference is recorded in each scenario's ``expected.json`` (``source``)
and the rules file cites the same places. Public bug reports were NOT used to write these.
Hostnames, PIDs, addresses and times are invented. Run:

    .venv/bin/python tests/triage/corpus/_build/build.py

It rewrites every ``syn_*`` scenario (deterministic: fixed seed and times).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import shutil
import sys
from pathlib import Path

CORPUS = Path(__file__).resolve().parent.parent
T0 = dt.datetime(2026, 11, 30, 9, 0, 0, tzinfo=dt.timezone.utc).timestamp()
rng = random.Random(1234)

REF_PT_NCCL = "PyTorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (watchdog timeout / abort messages)"
REF_PT_OOM = "PyTorch c10/cuda/CUDACachingAllocator.cpp (torch.OutOfMemoryError text)"
REF_NCCL = "NCCL src/debug.cc (host:pid:tid [dev] NCCL WARN/INFO prefix), src/transport/net_ib.cc, src/misc/utils.cc"
REF_XID = "NVIDIA Xid catalog https://docs.nvidia.com/deploy/xid-errors/ and the driver's 'NVRM: Xid (PCI:%s): %d, ...' format"
REF_KERNEL = "Linux kernel sources: mm/oom_kill.c, drivers/edac/edac_mc.c, arch/x86/kernel/cpu/mce/core.c, block/blk-core.c"
REF_TORCHRUN = "PyTorch torch/distributed/elastic (ChildFailedError summary, api.py exit lines) — format as captured here in real_*"
REF_SLURM = "Slurm src/slurmd/slurmstepd/req.c ('*** JOB %u ON %s CANCELLED AT %s DUE TO %s ***'), src/srun, task/cgroup oom message"


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]


def syslog(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).strftime("%b %d %H:%M:%S")


def ctime(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).strftime("%a %b %d %H:%M:%S %Y")


def glog(t: float, level: str = "E") -> str:
    d = dt.datetime.fromtimestamp(t, tz=dt.timezone.utc)
    return f"{level}{d:%m%d %H:%M:%S}.{d.microsecond:06d}"


#: expectations changed by issue 17 (labelling conventions) and why
RECONCILED = {
    "watchdog_all_ranks_same_seq": "reconciled (issue 17 labelling conventions): only timeouts show the stall, so the class is hang, not comm_error; a stall no error line explains is code/config-level, so fix_code_or_config",
    "watchdog_rank_absent_8": "reconciled (issue 17 conventions): a rank stuck outside communication with no error line is a code-level stall: fix_code_or_config",
    "nccl_unhandled_system_error": "reconciled (issue 17 conventions): ncclSystemError is a failed system call of NCCL's setup (shm, sockets, interfaces), a configuration to fix (every public case of it); restarting as-is fails again",
    "deepspeed_loss_scale_floor": "reconciled (issue 17 conventions): the loss scale at its floor means every step overflows; DeepSpeed exits the run; the remedy is a precision/config change (bf16), not a restart",
    "nfs_stale_handle": "reconciled (issue 17): ESTALE means another client removed or replaced the file under this one (a shared file system layout/cleanup problem), so fix_code_or_config rather than a restart",
    "accelerate_barrier_rank_absent": "reconciled (issue 17 conventions): a rank that never reaches the barrier with no error line is a code-level stall (uneven control flow): fix_code_or_config",
}


class Scenario:
    def __init__(self, name: str, cls: str | None, culprit: dict, action: str | None, source: str, note: str = ""):
        self.dir = CORPUS / f"syn_{name}"
        if self.dir.exists():
            shutil.rmtree(self.dir)
        (self.dir / "logs").mkdir(parents=True)
        self.expected = {"class": cls, "culprit": culprit, "action": action,
                         "source": "built from message strings in the emitting software's source/docs: " + source,
                         "note": note}
        self.files: dict[str, list[str]] = {}
        if name in RECONCILED:
            self.expected["reconciled"] = RECONCILED[name]

    def add(self, rel: str, line: str) -> None:
        self.files.setdefault(rel, []).append(line)

    def write(self) -> None:
        for rel, lines in self.files.items():
            p = self.dir / "logs" / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("\n".join(lines) + "\n")
        (self.dir / "expected.json").write_text(json.dumps(self.expected, indent=2) + "\n")


def progress(sc: Scenario, rel: str, rank: int, steps: range, t: float, dt_s: float = 1.0, prefix: str = "",
             loss0: float = 3.0, slow_from: int | None = None) -> float:
    for s in steps:
        st = dt_s * (4.0 if slow_from is not None and s >= slow_from else 1.0) * (1 + rng.uniform(-0.03, 0.03))
        t += st
        loss = loss0 - 0.002 * s + rng.uniform(-0.01, 0.01)
        sc.add(rel, f"{prefix}{iso(t)} [rank{rank}] INFO step {s} loss {loss:.4f} grad_norm {rng.uniform(0.8, 1.2):.3f} "
                    f"step_time {st:.3f}s tokens/s {int(8192 / st)}")
    return t


def traceback(sc: Scenario, rel: str, rank: int, last: str, prefix: str | None = None, frames: int = 3) -> None:
    p = f"[rank{rank}]: " if prefix is None else prefix
    sc.add(rel, f"{p}Traceback (most recent call last):")
    for i in range(frames):
        sc.add(rel, f'{p}  File "/opt/app/train.py", line {100 + 7 * i}, in step_{i}')
        sc.add(rel, f"{p}    out = fn(batch)")
    sc.add(rel, f"{p}{last}")


def nccl_watchdog(rank: int, seq: int, op: str = "ALLREDUCE", timeout_ms: int = 600000) -> str:
    return (f"[rank{rank}]:[E1130 09:10:00.000000000 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank {rank}] "
            f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=1048576, "
            f"NumelOut=1048576, Timeout(ms)={timeout_ms}) ran for {timeout_ms + 17} milliseconds before timing out.")


def summary(sc: Scenario, rel: str, t: float, entries: list[tuple[str, int, int, int, int]]) -> None:
    """torchrun ChildFailedError summary; entries = (host, rank, local_rank, exitcode, pid); first is the root cause."""
    sc.add(rel, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ")
    sc.add(rel, "============================================================")
    sc.add(rel, "train.py FAILED")
    sc.add(rel, "------------------------------------------------------------")
    sc.add(rel, "Failures:")
    stamp = dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).strftime("%Y-%m-%d_%H:%M:%S")
    for i, (host, r, lr, code, pid) in enumerate(entries[1:], start=1):
        sc.add(rel, f"[{i}]:")
        sc.add(rel, f"  time      : {stamp}")
        sc.add(rel, f"  host      : {host}")
        sc.add(rel, f"  rank      : {r} (local_rank: {lr})")
        sig = {-15: "  (SIGTERM)", -9: "  (SIGKILL)", -11: "  (SIGSEGV)"}.get(code, "")
        sc.add(rel, f"  exitcode  : {code} (pid: {pid}){sig}")
        sc.add(rel, "  error_file: <N/A>")
        sc.add(rel, f"  traceback : Signal {-code} ({sig.strip(' ()')}) received by PID {pid}" if code < 0 else
               "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
    host, r, lr, code, pid = entries[0]
    sc.add(rel, "------------------------------------------------------------")
    sc.add(rel, "Root Cause (first observed failure):")
    sc.add(rel, "[0]:")
    sc.add(rel, f"  time      : {stamp}")
    sc.add(rel, f"  host      : {host}")
    sc.add(rel, f"  rank      : {r} (local_rank: {lr})")
    sig = {-15: "  (SIGTERM)", -9: "  (SIGKILL)", -11: "  (SIGSEGV)"}.get(code, "")
    sc.add(rel, f"  exitcode  : {code} (pid: {pid}){sig}")
    sc.add(rel, "  error_file: <N/A>")
    sc.add(rel, f"  traceback : Signal {-code} ({sig.strip(' ()')}) received by PID {pid}" if code < 0 else
           "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
    sc.add(rel, "============================================================")


def multi_node(sc: Scenario, nodes: list[str], per_node: int, steps: range, t: float) -> float:
    end = t
    for ni, host in enumerate(nodes):
        for lr in range(per_node):
            r = ni * per_node + lr
            end = max(end, progress(sc, f"{host}/rank{r}.log", r, steps, t))
    return end


# ------------------------------------------------------------------ scenarios
def xid79_16ranks() -> None:
    sc = Scenario("xid79_16ranks", "gpu_hardware", {"node": "gpu-b07"}, "exclude_node_and_restart",
                  f"{REF_XID}; {REF_PT_NCCL}; {REF_NCCL}",
                  "GPU falls off the bus on gpu-b07; 10 minutes later every other rank's watchdog fires (late errors)")
    nodes = ["gpu-a01", "gpu-b07"]
    t = multi_node(sc, nodes, 8, range(1, 40), T0)
    sc.add("gpu-b07/kern.log", f"{syslog(t - 200)} gpu-b07 kernel: nvidia-nvswitch0: open (major=508)")
    sc.add("gpu-b07/kern.log", f"{syslog(t + 2)} gpu-b07 kernel: NVRM: GPU at PCI:0000:3b:00: GPU-5f2c9a1e-0000-4000-8000-00000000b07a")
    sc.add("gpu-b07/kern.log", f"{syslog(t + 2)} gpu-b07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=48213, GPU has fallen off the bus.")
    sc.add("gpu-b07/kern.log", f"{syslog(t + 2)} gpu-b07 kernel: NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.")
    for r in range(16):
        if r == 11:
            continue
        host = nodes[r // 8]
        sc.add(f"{host}/rank{r}.log", nccl_watchdog(r, 4811).replace("E1130 09:10:00", glog(t + 602)[1:]
                                                                      .replace("1130 ", "E1130 ", 1)))
        sc.add(f"{host}/rank{r}.log", f"[rank{r}]:[E1130 {glog(t + 603)[6:]} ProcessGroupNCCL.cpp:1834] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
                                       "Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, "
                                       "subsequent GPU operations might run on corrupted/incomplete data. To avoid data inconsistency, "
                                       "we are taking the entire process down.")
    sc.add("gpu-b07/rank11.log", "[rank11]: RuntimeError: CUDA error: unknown error")
    sc.write()


def xid48_dbe() -> None:
    sc = Scenario("xid48_dbe", "gpu_hardware", {"node": "node-c3"}, "exclude_node_and_restart",
                  f"{REF_XID} (Xid 48 DBE, 'uncorrectable ECC error encountered' = cudaErrorECCUncorrectable)",
                  "dmesg -T format; rank 3's traceback a second later")
    t = progress(sc, "node-c3/train_rank3.log", 3, range(1, 30), T0)
    progress(sc, "node-c3/train_rank2.log", 2, range(1, 30), T0)
    sc.add("node-c3/dmesg.txt", f"[{ctime(t - 3000)}] ACPI: bus type PCI registered")
    sc.add("node-c3/dmesg.txt", f"[{ctime(t + 1)}] NVRM: Xid (PCI:0000:c1:00): 48, pid=9121, name=python, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 3, subpartition 0.")
    traceback(sc, "node-c3/train_rank3.log", 3, "RuntimeError: CUDA error: uncorrectable ECC error encountered")
    traceback(sc, "node-c3/train_rank2.log", 2, "RuntimeError: NCCL communicator was aborted on rank 2.")
    sc.write()


def xid13_illegal_access() -> None:
    sc = Scenario("xid13_illegal_access", "user_code", {"rank": 2}, "fix_code_or_config",
                  f"{REF_XID} (Xid 13/31: RESTART_APP, usually the application); CUDA 'an illegal memory access was encountered'",
                  "an application bug that the driver also logs as Xid 13 — not hardware")
    t = progress(sc, "rank2.log", 2, range(1, 20), T0)
    progress(sc, "rank0.log", 0, range(1, 20), T0)
    sc.add("kernel.log", f"{syslog(t + 0.5)} trn-17 kernel: NVRM: Xid (PCI:0000:18:00): 13, pid=3321, name=python, Graphics SM Warp Exception on (GPC 1, TPC 2, SM 0): Out Of Range Address")
    traceback(sc, "rank2.log", 2, "RuntimeError: CUDA error: an illegal memory access was encountered")
    sc.add("rank0.log", "[rank0]: RuntimeError: [Rank 0] NCCL watchdog thread terminated with exception: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.")
    sc.write()


NVSMI = """==============NVSMI LOG==============

Timestamp                                 : {ts}
Driver Version                            : 550.54.15
CUDA Version                              : 12.4

Attached GPUs                             : 2
GPU 00000000:18:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    ECC Errors
        Volatile
            SRAM Correctable              : 0
            SRAM Uncorrectable            : 0
            DRAM Correctable              : 2
            DRAM Uncorrectable            : 0
    Remapped Rows
        Correctable Error                 : 0
        Uncorrectable Error               : 0
        Pending                           : No
        Remapping Failure Occurred        : No
    Clocks Event Reasons
        Idle                              : Not Active
        HW Slowdown                       : Not Active

GPU 00000000:3B:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    ECC Errors
        Volatile
            SRAM Correctable              : 0
            SRAM Uncorrectable            : 0
            DRAM Correctable              : 0
            DRAM Uncorrectable            : 4
    Remapped Rows
        Correctable Error                 : 0
        Uncorrectable Error               : 1
        Pending                           : Yes
        Remapping Failure Occurred        : No
    Clocks Event Reasons
        Idle                              : Not Active
        HW Slowdown                       : Not Active
"""


def nvsmi_remap() -> None:
    sc = Scenario("nvsmi_remap_pending", "gpu_hardware", {"node": "gpu-a03"}, "exclude_node_and_restart",
                  "nvidia-smi -q field names (driver 450+: 'ECC Errors > Volatile > DRAM Uncorrectable', "
                  "'Remapped Rows > Pending'); NVIDIA row-remapping docs; CUDA cudaErrorECCUncorrectable",
                  "the nvidia-smi dump taken by the prolog after the crash shows a pending row remap on GPU 3B")
    t = progress(sc, "gpu-a03/rank5.log", 5, range(1, 25), T0)
    traceback(sc, "gpu-a03/rank5.log", 5, "RuntimeError: CUDA error: uncorrectable ECC error encountered")
    (sc.dir / "logs" / "gpu-a03").mkdir(parents=True, exist_ok=True)
    sc.files["gpu-a03/nvidia-smi-q.txt"] = NVSMI.format(ts=ctime(t + 20)).splitlines()
    sc.write()


def mce_host() -> None:
    sc = Scenario("mce_edac_ue", "gpu_hardware", {"node": "n12"}, "exclude_node_and_restart", REF_KERNEL,
                  "host memory uncorrectable error on n12 (hardware class covers the node's hardware)")
    t = progress(sc, "n12/rank4.log", 4, range(1, 15), T0)
    sc.add("n12/journal.txt", f"{syslog(t + 1)} n12 kernel: mce: [Hardware Error]: Machine check events logged")
    sc.add("n12/journal.txt", f"{syslog(t + 1)} n12 kernel: EDAC MC1: 1 UE memory read error on CPU_SrcID#1_MC#0_Chan#2_DIMM#0 (channel:2 slot:0 page:0x4f1a2 offset:0x0 grain:32)")
    sc.add("n12/rank4.log", "[rank4]: Fatal Python error: Bus error")
    sc.write()


def cuda_oom_64() -> None:
    sc = Scenario("cuda_oom_64ranks_late_timeouts", "oom", {"rank": 37}, "fix_code_or_config",
                  f"{REF_PT_OOM}; {REF_PT_NCCL}; {REF_TORCHRUN}",
                  "64 ranks on 8 nodes; rank 37 OOMs; 30 minutes later 63 watchdog timeouts and a stray CUDA error")
    nodes = [f"h100-{i:02d}" for i in range(8)]
    t = multi_node(sc, nodes, 8, range(1, 12), T0)
    traceback(sc, "h100-04/rank37.log", 37,
              "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 5 has a total capacity of "
              "79.11 GiB of which 1.21 GiB is free. Including non-PyTorch memory, this process has 77.88 GiB memory in use.")
    sc.add("h100-04/rank37.log", f"{iso(t + 0.1)} [rank37] ERROR exiting after error")
    for r in range(64):
        if r == 37:
            continue
        host = nodes[r // 8]
        sc.add(f"{host}/rank{r}.log", f"{iso(t + 1800)} [rank{r}] ERROR collective timed out")
        sc.add(f"{host}/rank{r}.log", nccl_watchdog(r, 2291, timeout_ms=1800000))
    sc.add("h100-06/rank50.log", f"{iso(t + 1801)} [rank50] ERROR RuntimeError: CUDA error: unspecified launch failure")
    sc.write()


def nccl_ib() -> None:
    sc = Scenario("nccl_ib_completion_error", "network", {"node": "n05"}, "exclude_node_and_restart",
                  f"{REF_NCCL} ('NET/IB : Got completion from peer %s with status=%d opcode=%d len=%d vendor err %d (%s)'); "
                  "Linux mlx5_core link messages",
                  "the link on n05 flaps, NCCL IB completion errors follow, other ranks see remote errors later")
    t = multi_node(sc, ["n04", "n05"], 4, range(1, 20), T0)
    sc.add("n05/dmesg.log", f"{syslog(t + 0.2)} n05 kernel: mlx5_core 0000:5e:00.0: mlx5_port_module_event:1143:(pid 0): Port module event: module 0, Cable unplugged")
    sc.add("n05/dmesg.log", f"{syslog(t + 0.3)} n05 kernel: mlx5_core 0000:5e:00.0 ibp94s0: Link down")
    sc.add("n05/rank6.log", f"n05:20417:20561 [2] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.20.0.4<52114> with status=12 opcode=0 len=0 vendor err 129 (Send) localGid fe80::a288:c203:5e:1 remoteGid fe80::a288:c203:5e:9a hca mlx5_0")
    sc.add("n05/rank6.log", "n05:20417:20561 [2] NCCL INFO transport/net.cc:1134 -> 6")
    for r in range(4):
        sc.add(f"n04/rank{r}.log", f"[rank{r}]: RuntimeError: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5")
        sc.add(f"n04/rank{r}.log", "[rank%d]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely." % r)
    sc.write()


def ib_async() -> None:
    sc = Scenario("nccl_ib_async_port_error", "network", {"node": "gpu-e14"}, "exclude_node_and_restart",
                  f"{REF_NCCL} ('NET/IB : %s:%d Got async event : %s' with ibv_event_type_str = 'port error')")
    t = progress(sc, "gpu-e14.rank9.log", 9, range(1, 30), T0)
    sc.add("gpu-e14.rank9.log", "gpu-e14:7781:7790 [1] NCCL INFO comm 0x5581e3c0 rank 9 nranks 16 cudaDev 1 nvmlDev 1 busId 1b000 commId 0x9f1 - Init COMPLETE")
    sc.add("gpu-e14.rank9.log", "gpu-e14:7781:7802 [1] NCCL WARN NET/IB : mlx5_3:1 Got async event : port error")
    sc.add("gpu-e14.rank9.log", f"[rank9]: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, NCCL version 2.20.5")
    sc.write()


def link_down_gloo() -> None:
    sc = Scenario("nic_link_down_gloo", "network", {"node": "cpu-n2"}, "exclude_node_and_restart",
                  "Linux netdev drivers ('%s NIC Link is Down'); gloo pair.cc 'Connection reset by peer' (gloo format captured here)")
    t = progress(sc, "cpu-n2/worker.log", 1, range(1, 50), T0)
    progress(sc, "cpu-n1/worker.log", 0, range(1, 50), T0)
    sc.add("cpu-n2/kern.log", f"{syslog(t + 0.5)} cpu-n2 kernel: ice 0000:17:00.0 ens1f0: NIC Link is Down")
    sc.add("cpu-n1/worker.log", "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection reset by peer [10.0.0.2]:41822")
    sc.add("cpu-n2/worker.log", "[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [10.0.0.1]:63418: Connection reset by peer")
    sc.write()


def watchdog_all_same() -> None:
    sc = Scenario("watchdog_all_ranks_same_seq", "hang", {"rank": None}, "fix_code_or_config", REF_PT_NCCL,
                  "all 8 ranks time out in the same collective; nothing else: the communication layer stalled")
    for r in range(8):
        t = progress(sc, f"rank{r}.log", r, range(1, 10), T0)
        sc.add(f"rank{r}.log", nccl_watchdog(r, 1234))
    sc.write()


def watchdog_missing_rank() -> None:
    sc = Scenario("watchdog_rank_absent_8", "hang", {"rank": 6}, "fix_code_or_config", REF_PT_NCCL,
                  "7 ranks time out in SeqNum 5001; rank 6 reports nothing: it never entered the collective")
    for r in range(8):
        progress(sc, f"logs_rank{r}.txt", r, range(1, 10), T0)
        if r != 6:
            sc.add(f"logs_rank{r}.txt", nccl_watchdog(r, 5001))
    sc.write()


def nccl_invalid_usage() -> None:
    sc = Scenario("nccl_invalid_usage", "comm_error", {"rank": 1}, "fix_code_or_config",
                  f"{REF_NCCL} (ncclGetErrorString(ncclInvalidUsage) = 'invalid usage (run with NCCL_DEBUG=WARN for details)'); PyTorch NCCLUtils")
    progress(sc, "r1.log", 1, range(1, 3), T0)
    sc.add("r1.log", "node-x1:311:311 [1] NCCL WARN Invalid config blocking attribute value -2147483648")
    traceback(sc, "r1.log", 1, "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.19.3")
    sc.add("r1.log", "[rank1]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.")
    sc.write()


def nccl_system_error() -> None:
    sc = Scenario("nccl_unhandled_system_error", "comm_error", {"rank": 9}, "fix_code_or_config",
                  f"{REF_NCCL} (ncclGetErrorString(ncclSystemError) = 'unhandled system error (run with NCCL_DEBUG=INFO for details)')")
    t = progress(sc, "rank9.log", 9, range(1, 5), T0)
    progress(sc, "rank8.log", 8, range(1, 5), T0)
    traceback(sc, "rank9.log", 9, "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5")
    sc.add("rank8.log", "[rank8]: RuntimeError: [Rank 8] NCCL watchdog thread terminated with exception: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.")
    sc.write()


def heartbeat() -> None:
    sc = Scenario("heartbeat_monitor_stuck", "hang", {"rank": 3}, "restart_from_checkpoint",
                  f"{REF_PT_NCCL} (HeartbeatMonitor: 'Heartbeat monitor timed out! Process will be terminated after dumping debug info.')")
    t = progress(sc, "rank3.log", 3, range(1, 10), T0)
    sc.add("rank3.log", f"[rank3]:[{glog(t + 480)} ProcessGroupNCCL.cpp:1557] [PG ID 0 PG GUID 0(default_pg) Rank 3] Heartbeat monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()=1")
    sc.write()


def deepspeed_scale_floor() -> None:
    sc = Scenario("deepspeed_loss_scale_floor", "numerical", {"rank": 0}, "fix_code_or_config",
                  "DeepSpeed runtime/fp16/fused_optimizer.py ('[deepspeed] OVERFLOW! Rank %d Skipping step. Attempted loss scale: %s, reducing to %s') "
                  "and runtime/fp16/loss_scaler.py ('Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.')",
                  "fp16 overflows are normal until the scale hits its floor")
    t = progress(sc, "rank0.log", 0, range(1, 40), T0)
    scale = 65536
    for i in range(12):
        sc.add("rank0.log", f"[{iso(t + i)}] [INFO] [fused_optimizer.py:354:_update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {scale}, reducing to {scale // 2}")
        scale //= 2
    traceback(sc, "rank0.log", 0, "Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.")
    sc.write()


def megatron_nan() -> None:
    sc = Scenario("megatron_nan_grad_norm", "numerical", {"rank": 12}, "skip_step",
                  "Megatron-LM megatron/training/training.py iteration log format and core/distributed "
                  "('Rank {rank}: found NaN in local grad norm in backward pass before data-parallel communication collective')")
    for r in (0, 12):
        for it in range(1, 8):
            sc.add(f"megatron_rank{r}.log", f" [{iso(T0 + it * 5)}] iteration        {it}/   10000 | consumed samples:        {it * 512} | "
                                            f"elapsed time per iteration (ms): 5012.3 | learning rate: 1.000E-04 | global batch size:   512 | "
                                            f"lm loss: {3.2 - it * 0.01:.6E} | loss scale: 1.0 | grad norm: 1.021 | number of skipped iterations:   0 | number of nan iterations:   0 |")
    sc.add("megatron_rank12.log", f"[{iso(T0 + 41)}] AssertionError: Rank 12: found NaN in local grad norm in backward pass before data-parallel communication collective. Device: 4, node: mt-node-02")
    sc.write()


def hf_trainer_nan() -> None:
    sc = Scenario("hf_trainer_nan_loss", "numerical", {"rank": None}, "skip_step",
                  "Hugging Face transformers Trainer.log (prints the logs dict: {'loss': ..., 'grad_norm': ..., 'learning_rate': ..., 'epoch': ...})",
                  "single-process Trainer output: the loss dict turns to nan")
    for i in range(1, 20):
        sc.add("trainer_stdout.txt", f"{{'loss': {2.5 - i * 0.01:.4f}, 'grad_norm': {1.0 + i * 0.01:.3f}, 'learning_rate': 4.99e-05, 'epoch': {i * 0.01:.2f}}}")
    sc.add("trainer_stdout.txt", "{'loss': nan, 'grad_norm': nan, 'learning_rate': 4.98e-05, 'epoch': 0.2}")
    sc.add("trainer_stdout.txt", "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 4.98e-05, 'epoch': 0.21}")
    sc.write()


def lightning_enospc() -> None:
    sc = Scenario("lightning_ckpt_enospc", "storage", {"rank": 0}, "fix_code_or_config",
                  "glibc strerror(ENOSPC); PyTorch caffe2/serialize/inline_container.cc ('PytorchStreamWriter failed writing file %s: file write failed'); "
                  "Lightning ModelCheckpoint save path")
    t = progress(sc, "rank_0/stderr.log", 0, range(1, 30), T0)
    progress(sc, "rank_1/stderr.log", 1, range(1, 30), T0)
    traceback(sc, "rank_0/stderr.log", 0, "RuntimeError: [enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file data/3: file write failed")
    sc.add("rank_0/stderr.log", "[rank0]: OSError: [Errno 28] No space left on device: '/ckpt/epoch=3-step=1200.ckpt'")
    sc.add("rank_1/stderr.log", "[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.1.0.3]:3118")
    sc.write()


def nfs_stale() -> None:
    sc = Scenario("nfs_stale_handle", "storage", {"rank": 4}, "fix_code_or_config",
                  "glibc strerror(ESTALE) = 'Stale file handle'; Python OSError formatting")
    t = progress(sc, "rank4.log", 4, range(1, 30), T0)
    traceback(sc, "rank4.log", 4, "OSError: [Errno 116] Stale file handle: '/mnt/datasets/shard-00312.bin'")
    sc.write()


def kernel_disk() -> None:
    sc = Scenario("kernel_disk_io_error", "storage", {"node": "st-node-4"}, "exclude_node_and_restart",
                  f"{REF_KERNEL} (blk_update_request: I/O error, dev %s; fs/ext4 'EXT4-fs error (device %s)'); glibc strerror(EIO)")
    t = progress(sc, "st-node-4/rank2.log", 2, range(1, 30), T0)
    sc.add("st-node-4/dmesg.log", f"[{ctime(t + 0.1)}] blk_update_request: I/O error, dev nvme0n1, sector 81920 op 0x1:(WRITE) flags 0x800 phys_seg 1 prio class 0")
    sc.add("st-node-4/dmesg.log", f"[{ctime(t + 0.2)}] EXT4-fs error (device nvme0n1p1): ext4_find_entry:1455: inode #2: comm python: reading directory lblock 0")
    traceback(sc, "st-node-4/rank2.log", 2, "OSError: [Errno 5] Input/output error: '/local/ckpt/step_30/shard_2.distcp'")
    sc.write()


def host_oom_journal() -> None:
    sc = Scenario("host_oom_killer_journalctl", "oom", {"rank": 2}, "fix_code_or_config",
                  f"{REF_KERNEL} ('Out of memory: Killed process %d (%s) total-vm:%lukB, anon-rss:%lukB, ...'); {REF_TORCHRUN}",
                  "the killed PID is mapped to rank 2 through torchrun's exit line")
    t = progress(sc, "console.log", 2, range(1, 10), T0, prefix="[default2]:")
    sc.add("journalctl-k.txt", f"{syslog(t + 1)} cpu-big-1 kernel: python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0")
    sc.add("journalctl-k.txt", f"{syslog(t + 1)} cpu-big-1 kernel: Out of memory: Killed process 424242 (python) total-vm:98234112kB, anon-rss:90112340kB, file-rss:1024kB, shmem-rss:0kB, UID:1000 pgtables:180000kB oom_score_adj:0")
    sc.add("console.log", f"W1130 {glog(t + 2, 'W')[5:]} 4200 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 424240 closing signal SIGTERM")
    sc.add("console.log", f"E1130 {glog(t + 2)[5:]} 4200 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 2 (pid: 424242) of binary: /usr/bin/python")
    sc.write()


def slurm_oom() -> None:
    sc = Scenario("slurm_oom_kill", "oom", {"node": "gpu-c11"}, "fix_code_or_config", REF_SLURM)
    t = progress(sc, "slurm-881234.out", 0, range(1, 20), T0, prefix="0: ")
    sc.add("slurm-881234.out", f"slurmstepd: error: Detected 1 oom-kill event(s) in StepId=881234.0. Some of your processes may have been killed by the cgroup out-of-memory handler.")
    sc.add("slurm-881234.out", "srun: error: gpu-c11: task 5: Out Of Memory")
    sc.add("slurm-881234.out", "srun: error: gpu-c10: task 0: Terminated")
    sc.write()


def slurm_timelimit() -> None:
    sc = Scenario("slurm_time_limit", "launcher", {"rank": None}, "restart_from_checkpoint", REF_SLURM)
    t = progress(sc, "slurm-99.out", 0, range(1, 20), T0, prefix="0: ")
    stamp = dt.datetime.fromtimestamp(t + 1, tz=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    sc.add("slurm-99.out", f"slurmstepd: error: *** JOB 99 ON gpu-c02 CANCELLED AT {stamp} DUE TO TIME LIMIT ***")
    sc.add("slurm-99.out", f"slurmstepd: error: *** STEP 99.0 ON gpu-c02 CANCELLED AT {stamp} DUE TO TIME LIMIT ***")
    sc.add("slurm-99.out", "srun: error: gpu-c02: task 0: Terminated")
    sc.write()


def slurm_node_fail() -> None:
    sc = Scenario("slurm_node_failure", "launcher", {"node": "gpu-c04"}, "exclude_node_and_restart", REF_SLURM)
    t = progress(sc, "slurm-77.out", 0, range(1, 20), T0, prefix="0: ")
    stamp = dt.datetime.fromtimestamp(t + 1, tz=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    sc.add("slurm-77.out", f"slurmstepd: error: *** JOB 77 ON gpu-c04 CANCELLED AT {stamp} DUE TO NODE FAILURE ***")
    sc.write()


def rdzv_multinode() -> None:
    sc = Scenario("rdzv_timeout_second_node", "launcher", {"rank": None}, "retry",
                  "PyTorch torch/distributed/elastic/rendezvous/dynamic_rendezvous.py (RendezvousTimeoutError); "
                  "format of agent lines as captured in real_rdzv_timeout")
    sc.add("node-b/agent.log", f"I1130 {glog(T0, 'I')[5:]} 771 torch/distributed/elastic/agent/server/api.py:869] [default] starting workers for entrypoint: python")
    sc.add("node-b/agent.log", f"I1130 {glog(T0 + 1, 'I')[5:]} 771 torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:1154] The node 'node-b_771_0' attempts to join the next round of the rendezvous 'job7'.")
    sc.add("node-b/agent.log", "Traceback (most recent call last):")
    sc.add("node-b/agent.log", '  File "/usr/lib/python3/site-packages/torch/distributed/elastic/rendezvous/dynamic_rendezvous.py", line 680, in run')
    sc.add("node-b/agent.log", "    raise RendezvousTimeoutError")
    sc.add("node-b/agent.log", "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError")
    sc.write()


def addr_in_use() -> None:
    sc = Scenario("store_port_in_use", "launcher", {"rank": None}, "fix_code_or_config",
                  "PyTorch torch/csrc/distributed/c10d/socket.cpp ('The server socket has failed to listen on any local network address. ... name: EADDRINUSE, message: address already in use')")
    sc.add("launch.log", f"[W1130 {glog(T0, 'W')[5:]} socket.cpp:464] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).")
    sc.add("launch.log", "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
    sc.write()


def keyerror_8() -> None:
    sc = Scenario("keyerror_rank3_of_8", "user_code", {"rank": 3}, "fix_code_or_config",
                  f"Python traceback format; NCCL ncclRemoteError text; {REF_TORCHRUN}",
                  "one rank's data bug; the other seven fail with remote errors a moment later (misleading late errors)")
    for r in range(8):
        t = progress(sc, f"node-q/{r}/stderr.log", r, range(1, 15), T0)
    traceback(sc, "node-q/3/stderr.log", 3, "KeyError: 'input_ids'")
    for r in range(8):
        if r != 3:
            sc.add(f"node-q/{r}/stderr.log", f"{iso(t + 3)} [rank{r}] ERROR collective failed")
            sc.add(f"node-q/{r}/stderr.log", f"[rank{r}]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:2006, remote process exited or there was a network error, NCCL version 2.21.5")
            sc.add(f"node-q/{r}/stderr.log", f"[rank{r}]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.")
    summary(sc, "node-q/agent.log", t + 4, [("node-q", 3, 3, 1, 9003)] + [("node-q", r, r, -15, 9000 + r) for r in range(8) if r != 3])
    sc.write()


def segfault() -> None:
    sc = Scenario("segfault_summary_only", "user_code", {"rank": 5}, "fix_code_or_config", REF_TORCHRUN,
                  "only torchrun's summary: rank 5 died of SIGSEGV, the others got SIGTERM")
    summary(sc, "torchrun.log", T0 + 100, [("trn-3", 5, 1, -11, 7105)] + [("trn-3", r, r - 4, -15, 7100 + r) for r in (4, 6, 7)])
    sc.write()


def throughput_then_timeout() -> None:
    sc = Scenario("straggler_then_all_timeouts", "hang", {"rank": 2}, "restart_from_checkpoint",
                  f"{REF_PT_NCCL}; progress-line format as captured here",
                  "the whole job slows 4x at step 25 (synchronous training: everyone waits for the straggler), then "
                  "rank 2 stops and the others time out: the throughput drop is the first anomaly, rank 2 the culprit")
    for r in range(4):
        t = progress(sc, f"rank{r}.log", r, range(1, 40), T0, dt_s=0.5, slow_from=25)
        if r != 2:
            sc.add(f"rank{r}.log", nccl_watchdog(r, 800, timeout_ms=60000))
    sc.write()


def nccl_cuda_oom() -> None:
    sc = Scenario("nccl_cuda_oom_pid_map", "oom", {"rank": 14, "node": "gpu-f2"}, "fix_code_or_config",
                  f"{REF_NCCL} ('Cuda failure '%s'' from CUDACHECK; 'Init COMPLETE' INFO line carries rank and busId)",
                  "the NCCL WARN names only host:pid:tid; the INFO init line maps that pid to rank 14")
    sc.add("nccl_debug.log", "gpu-f2:55101:55101 [6] NCCL INFO comm 0x7f3a2c0 rank 14 nranks 16 cudaDev 6 nvmlDev 6 busId b1000 commId 0x77a1 - Init COMPLETE")
    sc.add("nccl_debug.log", "gpu-f2:55100:55100 [5] NCCL INFO comm 0x7f3a2d0 rank 13 nranks 16 cudaDev 5 nvmlDev 5 busId a1000 commId 0x77a1 - Init COMPLETE")
    sc.add("nccl_debug.log", "gpu-f2:55101:55190 [6] include/alloc.h:124 NCCL WARN Cuda failure 'out of memory'")
    sc.add("nccl_debug.log", "gpu-f2:55101:55190 [6] NCCL INFO include/alloc.h:130 -> 1")
    sc.add("nccl_debug.log", "gpu-f2:55100:55188 [5] NCCL WARN Error : ring 0 does not loop back to start (1 != 5)")
    sc.write()


def barrier_missing() -> None:
    sc = Scenario("accelerate_barrier_rank_absent", "hang", {"rank": 3}, "fix_code_or_config", REF_PT_NCCL,
                  "accelerate's wait_for_everyone() is a barrier; three ranks time out in it, rank 3 never arrives")
    for r in range(4):
        progress(sc, f"accelerate_rank{r}.log", r, range(1, 6), T0)
        if r != 3:
            sc.add(f"accelerate_rank{r}.log", nccl_watchdog(r, 45, op="BARRIER", timeout_ms=1800000))
    sc.write()


def late_xid_after_user_error() -> None:
    sc = Scenario("user_error_then_late_xid", "user_code", {"rank": 5}, "fix_code_or_config",
                  f"Python traceback format; {REF_XID}",
                  "rank 5 raises TypeError; 40 s after the job died an unrelated Xid on another node (outside the window)")
    t = multi_node(sc, ["p1", "p2"], 4, range(1, 10), T0)
    traceback(sc, "p2/rank5.log", 5, "TypeError: forward() got an unexpected keyword argument 'attention_mask'")
    sc.add("p2/rank5.log", f"{iso(t + 0.2)} [rank5] ERROR exiting")
    sc.add("p1/kern.log", f"{syslog(t + 75)} p1 kernel: NVRM: Xid (PCI:0000:61:00): 79, pid=1212, GPU has fallen off the bus.")
    sc.write()


def dmesg_boot_relative() -> None:
    sc = Scenario("dmesg_untimed_xid94", "gpu_hardware", {"node": "gpu-d02"}, "exclude_node_and_restart",
                  f"{REF_XID} (Xid 94 contained ECC error); dmesg default boot-relative stamps",
                  "the kernel log has no wall-clock time; it keeps its order and competes on priority")
    t = progress(sc, "gpu-d02/rank1.log", 1, range(1, 20), T0)
    sc.add("gpu-d02/dmesg", "[    2.001234] pci 0000:b1:00.0: [10de:2330] type 00 class 0x030200")
    sc.add("gpu-d02/dmesg", "[81234.567890] NVRM: Xid (PCI:0000:b1:00): 94, pid=4410, name=python, Contained: SM (0x1). RST: No, D-RST: No")
    traceback(sc, "gpu-d02/rank1.log", 1, "RuntimeError: CUDA error: uncorrectable ECC error encountered")
    sc.write()


def socket_unreachable() -> None:
    sc = Scenario("nccl_socket_no_route", "network", {"node": "gpu-g1"}, "exclude_node_and_restart",
                  f"{REF_NCCL} (src/misc/socket.cc connect failure with strerror(EHOSTUNREACH))")
    progress(sc, "gpu-g1_rank3.log", 3, range(1, 5), T0)
    sc.add("gpu-g1_rank3.log", "gpu-g1:8122:8201 [3] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.3.0.17<34051> failed : No route to host")
    sc.add("gpu-g1_rank3.log", "gpu-g1:8122:8201 [3] NCCL INFO misc/socket.cc:567 -> 6")
    sc.write()


def xid74_nvlink() -> None:
    sc = Scenario("xid74_nvlink", "gpu_hardware", {"node": "dgx-07"}, "exclude_node_and_restart",
                  f"{REF_XID} (Xid 74 NVLink error); {REF_NCCL}")
    t = progress(sc, "dgx-07/rank0.log", 0, range(1, 20), T0)
    sc.add("dgx-07/syslog", f"{syslog(t + 0.4)} dgx-07 kernel: NVRM: Xid (PCI:0000:07:00): 74, pid=2001, name=python, NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)")
    sc.add("dgx-07/rank0.log", "dgx-07:2001:2090 [0] NCCL WARN Cuda failure 'an NVLink error'")
    sc.write()


def store_timeout() -> None:
    sc = Scenario("store_clients_timeout", "launcher", {"rank": None}, "retry",  # the reporter is not the culprit
                  "PyTorch torch/csrc/distributed/c10d/TCPStore ('Timed out after %d seconds waiting for clients. %d/%d clients joined.')")
    sc.add("rank0.log", f"{iso(T0)} [rank0] INFO init_process_group")
    traceback(sc, "rank0.log", 0, "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 3/4 clients joined.")
    sc.write()


def healthy() -> None:
    """A run that finished: a Titan run directory whose run.json (written with the real RunDir) says it succeeded."""
    sys.path.insert(0, str(CORPUS.parents[2] / "src"))
    from titan.events import RunDir

    sc = Scenario("healthy_run_no_failure", None, {"rank": None}, None, "progress-line format as captured here",
                  "a run that finished (run.json: exit 0, SUCCEEDED) with no incident: triage exits 0 and reports none")
    sc.expected.update(outcome="succeeded", exit=0, incidents=[],
                       reconciled="issue 15: a run directory whose run.json says it succeeded gets exit 0 and the "
                                  "incidents it handled (none here); before: raw logs only, 'no diagnosis' (exit 5)")
    for r in range(2):
        t = progress(sc, f"run1/rank{r}.log", r, range(1, 60), T0)
        sc.add(f"run1/rank{r}.log", f"{iso(t + 1)} [rank{r}] INFO training finished")
    sc.write()
    rd = RunDir.create(sc.dir / "logs", "run1")
    rd.update_run_json({"run_id": "run1", "status": "finished", "exit_code": 0, "exit_name": "SUCCEEDED",
                        "started_at": T0, "finished_at": T0 + 61.0, "restarts": 0, "failures": []})


def ddp_unused_params() -> None:
    sc = Scenario("ddp_unused_parameters", "user_code", {"rank": 0}, "fix_code_or_config",
                  "PyTorch torch/nn/parallel/distributed.py / reducer.cpp ('Expected to have finished reduction in the prior iteration before starting a new one.')")
    t = progress(sc, "rank0.log", 0, range(1, 3), T0)
    traceback(sc, "rank0.log", 0, "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This error indicates that your module has parameters that were not used in producing loss.")
    sc.write()


def run_dirs() -> None:
    """Titan run directories written with the real titan.events.EventWriter (the event kinds of the brief)."""
    sys.path.insert(0, str(CORPUS.parents[2] / "src"))
    from titan.events import EventWriter, RunDir

    def make(name: str, cls: str | None, culprit: dict, action: str | None, note: str, body) -> None:  # type: ignore[no-untyped-def]
        sc = Scenario(name, cls, culprit, action, "titan.events.EventWriter with the event kinds of docs/events.md", note)
        sc.expected["source"] = ("written with the real titan.events.EventWriter (run-directory format), event kinds "
                                 "and data fields as documented in docs/events.md (worker.failed, guard.*, ckpt.*, "
                                 "hang.detected, inject.*, dist.init_failed, step)")
        rd = RunDir.create(sc.dir / "logs", "run1")
        body(rd)
        sc.write()

    def steps(rd, ranks, n, t0, loss_bad=None):  # type: ignore[no-untyped-def]
        for r in ranks:
            with EventWriter(rd.event_file("node-a", r, 0, 1000 + r), run="run1", node="node-a", rank=r) as w:
                for s in range(1, n + 1):
                    loss = float("nan") if loss_bad and loss_bad[0] == r and s >= loss_bad[1] else 2.0 - s * 0.01
                    w.emit("step", step=s, data={"loss": loss, "lr": 1e-3, "grad_norm": 1.0, "samples": s * 16,
                                                 "step_time_s": 0.1})

    def nan_run(rd):  # type: ignore[no-untyped-def]
        steps(rd, [0, 1], 20, T0)
        with EventWriter(rd.event_file("node-a", 1, 0, 2001), run="run1", node="node-a", rank=1) as w:
            w.emit("guard.nonfinite", "non-finite loss on rank 1", level="warning", step=21, data={"what": "loss"})
            w.emit("guard.skip", "skipped step 21", step=21)

    def ckpt_run(rd):  # type: ignore[no-untyped-def]
        steps(rd, [0, 1], 10, T0)
        with EventWriter(rd.event_file("node-a", 0, 0, 2000), run="run1", node="node-a", rank=0) as w:
            w.emit("ckpt.failed", "checkpoint save failed", level="error", step=10,
                   data={"error": "OSError: [Errno 28] No space left on device"})
        with EventWriter(rd.launcher_file("node-a"), run="run1", node="node-a") as w:
            w.emit("worker.failed", level="error", data={"exit_code": 1, "signal": None, "pid": 2000, "local_rank": 0,
                                                          "global_rank": 0, "attempt": 0, "error_file": None,
                                                          "error": "OSError: [Errno 28] No space left on device"})

    def hang_run(rd):  # type: ignore[no-untyped-def]
        steps(rd, [0, 1, 2], 10, T0)
        rd.events_dir.mkdir(parents=True, exist_ok=True)
        with EventWriter(rd.events_dir / "watchdog.node-a.jsonl", run="run1", node="node-a") as w:
            w.emit("hang.detected", "rank 2 stopped first (data phase)", level="error",
                   data={"culprit": {"rank": 2, "node": "node-a", "phase": "data", "step": 10},
                         "reason": "stopped-first", "attempt": 0})

    def kill_run(rd):  # type: ignore[no-untyped-def]
        steps(rd, [0, 1], 10, T0)
        rd.events_dir.mkdir(parents=True, exist_ok=True)
        with EventWriter(rd.events_dir / "chaos.node-a.jsonl", run="run1", node="node-a") as w:
            w.emit("inject.kill", "drill: SIGKILL rank 1", level="warning",
                   data={"rank": 1, "pid": 1001, "attempt": 0, "signal": "SIGKILL", "step": 10, "t_kill": T0 + 1.5})
        with EventWriter(rd.launcher_file("node-a"), run="run1", node="node-a") as w:
            w.emit("worker.failed", level="error", data={"exit_code": -9, "signal": "SIGKILL", "pid": 1001, "local_rank": 1,
                                                          "global_rank": 1, "attempt": 0})
            w.emit("worker.stopped", level="warning", data={"exit_code": -15, "signal": "SIGTERM", "pid": 1000,
                                                             "local_rank": 0, "global_rank": 0, "attempt": 0})

    def init_run(rd):  # type: ignore[no-untyped-def]
        with EventWriter(rd.event_file("node-a", 1, 0, 3001), run="run1", node="node-a", rank=1) as w:
            w.emit("dist.init_failed", "init_process_group failed", level="error",
                   data={"attempt": 5, "endpoint": "node-a:29500", "error": "DistNetworkError: Connection reset by peer",
                         "retry_in_s": 4.0})

    def xid_run(rd):  # type: ignore[no-untyped-def]
        steps(rd, [0, 1], 10, T0)
        with EventWriter(rd.path / "agent.node-b.jsonl", run="run1", node="node-b") as w:
            w.emit("agent.xid", "Xid 79 on 0000:3b:00", level="critical",
                   data={"code": 79, "action": "exclude_node", "bucket": "hw", "pci": "0000:3b:00", "source": "kmsg",
                         "line": "NVRM: Xid (PCI:0000:3b:00): 79, pid=5100, GPU has fallen off the bus."})
        with EventWriter(rd.launcher_file("node-b"), run="run1", node="node-b") as w:
            w.emit("worker.failed", level="error", data={"exit_code": 1, "signal": None, "pid": 5100, "local_rank": 0,
                                                          "global_rank": 1, "attempt": 0,
                                                          "error": "RuntimeError: CUDA error: unknown error"})

    make("titan_run_agent_xid", "gpu_hardware", {"node": "node-b"}, "exclude_node_and_restart",
         "the node agent saw Xid 79 in the kernel log; the worker then died", xid_run)
    make("titan_run_guard_nonfinite", "numerical", {"rank": 1}, "skip_step", "guard saw a non-finite loss on rank 1", nan_run)
    make("titan_run_ckpt_enospc", "storage", {"rank": 0}, "fix_code_or_config", "checkpoint save hit a full disk", ckpt_run)
    make("titan_run_hang_detected", "hang", {"rank": 2}, "restart_from_checkpoint", "the agent's hang detector names rank 2", hang_run)
    make("titan_run_drill_kill", "launcher", {"rank": 1}, "restart_from_checkpoint", "a kill drill", kill_run)
    make("titan_run_init_failed", "launcher", {"rank": 1}, "retry", "rendezvous/init failure", init_run)


ALL = [xid79_16ranks, xid48_dbe, xid13_illegal_access, nvsmi_remap, mce_host, cuda_oom_64, nccl_ib, ib_async,
       link_down_gloo, watchdog_all_same, watchdog_missing_rank, nccl_invalid_usage, nccl_system_error, heartbeat,
       deepspeed_scale_floor, megatron_nan, hf_trainer_nan, lightning_enospc, nfs_stale, kernel_disk, host_oom_journal,
       slurm_oom, slurm_timelimit, slurm_node_fail, rdzv_multinode, addr_in_use, keyerror_8, segfault,
       throughput_then_timeout, nccl_cuda_oom, barrier_missing, late_xid_after_user_error, dmesg_boot_relative,
       socket_unreachable, xid74_nvlink, store_timeout, healthy, ddp_unused_params, run_dirs]

if __name__ == "__main__":
    for fn in ALL:
        fn()
    print(f"built {len(list(CORPUS.glob('syn_*')))} scenarios")
