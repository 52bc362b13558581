"""Formats of documented messages the corpus has no case of: each is read as its mechanism says.

Every snippet is a message of a real tool in its documented/source format (the rule's ``ref``),
behind the prefixes real logs carry (pdsh ``host: ``, Ray ``(Actor pid=N, ip=…)``, ``[rankN]:``).
These cover the rules no corpus case exercises, and the method's cause-vs-consequence steps on
inputs with no timestamps (one file's order is its time; across files it is unknown).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from titan.triage import triage

CASES: dict[str, tuple[str, dict[str, str]]] = {
 "pdsh_exc": ("user_code", {"worker-3.log": "worker-3: Traceback (most recent call last):\nworker-3:   File \"train.py\", line 3, in <module>\nworker-3: KeyError: 'labels'\n"}),
 "ray_exc": ("user_code", {"a.log": "(RayTrainWorker pid=2211, ip=10.0.0.4) Traceback (most recent call last):\n(RayTrainWorker pid=2211, ip=10.0.0.4)   File \"x.py\", line 2, in f\n(RayTrainWorker pid=2211, ip=10.0.0.4) TypeError: unsupported operand type(s)\n"}),
 "accelerate_summary": ("user_code", {"a.log": "Traceback (most recent call last):\n  File \"train.py\", line 10, in <module>\nAttributeError: 'NoneType' object has no attribute 'shape'\nTraceback (most recent call last):\n  File \"/usr/bin/accelerate\", line 8, in <module>\nsubprocess.CalledProcessError: Command '['/usr/bin/python', 'train.py']' returned non-zero exit status 1.\n"}),
 "ds_sigkill": ("launcher", {"a.log": "[2024-01-01 10:00:00,000] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 1234\n[2024-01-01 10:00:00,100] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', '-u', 'train.py'] exits with return code = -9\n"}),
 "segfault_shell": ("user_code", {"a.log": "step 1 loss 2.0\nSegmentation fault (core dumped)\n"}),
 "nccl_warn_only": ("comm_error", {"a.log": "node1:123:456 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\nnode1:123:456 [0] NCCL WARN Error : ring 0 does not loop back to start (1 != 0)\n"}),
 "gloo_enforce": ("comm_error", {"a.log": "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:208] ss1.ss_family == ss2.ss_family. 2 vs 10\n"}),
 "shm_bus": ("storage", {"a.log": "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\nRuntimeError: DataLoader worker (pid 1234) is killed by signal: Bus error.\n"}),
 "k8s_oom": ("oom", {"pod.txt": "    Last State:     Terminated\n      Reason:       OOMKilled\n      Exit Code:    137\n"}),
 "kbint_barrier": ("hang", {"a.log": "step 100 loss 1.2\n^CTraceback (most recent call last):\n  File \"train.py\", line 50, in <module>\n    dist.barrier()\n  File \"/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py\", line 3000, in barrier\n    work.wait()\nKeyboardInterrupt\n"}),
 "faulthandler_timeout": ("hang", {"a.log": "Timeout (0:30:00)!\nThread 0x00007f0000000700 (most recent call first):\n  File \"/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py\", line 3000 in all_reduce\n  File \"train.py\", line 80 in <module>\n"}),
 "train_loss_nan": ("numerical", {"a.log": "epoch 0 step 10 train_loss=2.31\nepoch 0 step 20 train_loss=nan\nepoch 0 step 30 train_loss=nan\n"}),
 "wandb_loss_nan": ("numerical", {"a.log": "{'train/loss': nan, 'train/grad_norm': nan, 'step': 12}\n"}),
 "env_missing": ("launcher", {"a.log": "ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable RANK expected, but not set\n"}),
 "sbatch_err": ("launcher", {"a.log": "sbatch: error: Batch job submission failed: Requested node configuration is not available\n"}),
 "gpu_lost": ("gpu_hardware", {"nvsmi.txt": "Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost.  Reboot the system to recover this GPU\n"}),
 "ucx_retry": ("network", {"a.log": "[n1:27251:0:27251] ib_mlx5_log.c:143  Transport retry count exceeded on mlx5_0:1/IB (synd 0x15 vend 0x81 hw_synd 0/0)\n"}),
 "torchrun_m9": ("launcher", {"a.log": "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0 (pid: 1234) of binary: /usr/bin/python3\n"}),
 "watchdog_old": ("hang", {"a.log": "[E ProcessGroupNCCL.cpp:566] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1803164 milliseconds before timing out.\n[E ProcessGroupNCCL.cpp:325] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data. To avoid this inconsistency, we are taking the entire process down.\n"}),
 "aborted_reason": ("hang", {"a.log": "RuntimeError: NCCL communicator was aborted on rank 3.  Original reason for failure was: [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=BROADCAST, Timeout(ms)=600000) ran for 600123 milliseconds before timing out.\n"}),
 "oom_then_timeout_untimed": ("oom", {"r0.log": "[rank0]:[E ProcessGroupNCCL.cpp:1] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600123 milliseconds before timing out.\n", "r1.log": "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"}),
 "exc_then_nccl_untimed": ("user_code", {"r3.log": "[rank3]: ValueError: bad shape\n", "r0.log": "[rank0]: RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1, unhandled system error, NCCL version 2.18.1\n"}),
 "warn_then_progress": ("hang", {"a.log": "[W socket.cpp:601] [c10d] The client socket has failed to connect to [localhost]:29500 (errno: 99 - Cannot assign requested address).\nstep 1 loss 2.0 step_time 1.0s\nstep 2 loss 1.9 step_time 1.0s\n"}),
 "loss_zero": ("numerical", {"a.log": "{'loss': 1.52, 'learning_rate': 2e-05, 'epoch': 0.1}\n{'loss': 0.0, 'learning_rate': 2e-05, 'epoch': 0.2}\n{'loss': 0.0, 'learning_rate': 2e-05, 'epoch': 0.3}\n{'loss': 0.0, 'learning_rate': 2e-05, 'epoch': 0.4}\n"}),
 "store_uniqueid": ("hang", {"a.log": "RuntimeError: [1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: Socket Timeout\n"}),
 "tqdm_stall": ("hang", {"train.log": "***** Running training *****\n  Num examples = 1000\n 45%|████▌     | 450/1000 [10:00<12:13, 1.33s/it]\n"}),
 "rdzv_never_met": ("launcher", {"agent.log": "I1130 09:00:01.000000 771 dynamic_rendezvous.py:1154] The node 'b_771_0' attempts to join the next round of the rendezvous 'job7'.\n"}),
 "nccl_over_sockets": ("network", {"n.log": "n1:1:2 [0] NCCL INFO NET/IB : No device found.\nn1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0\n"}),
 "words_only_network": ("network", {"a.log": "2024-01-01 10:00:00 ERROR worker lost its RDMA connection: infiniband port down\n"}),
 "plain_error": ("user_code", {"a.log": "2024-01-01 10:00:00 INFO loading\n2024-01-01 10:00:01 ERROR could not parse the template argument\n"}),
 "link_flap_kernel": ("network", {"n3/dmesg": "Nov 30 10:00:00 n3 kernel: mlx5_core 0000:5e:00.0 ens1f0: Link down\nNov 30 10:00:05 n3 kernel: mlx5_core 0000:5e:00.0 ens1f0: Link up\n", "n3/rank0.log": "2026-11-30 10:00:01,000 [rank0] RuntimeError: NCCL error: remote process exited or there was a network error\n"}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_documented_message_is_read_as_its_mechanism(name: str, tmp_path: Path) -> None:
    want, files = CASES[name]
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    v = triage([tmp_path])
    assert v.cls == want, f"{name}: expected {want}, got {v.cls} ({v.reason}; first anomaly {v.first_anomaly})"
    assert v.steps and v.action, f"{name}: a diagnosis names its action and its reasoning"


def test_actions_follow_the_evidence() -> None:
    """The same class, different evidence, different action."""
    import tempfile

    def verdict(files: dict[str, str]):  # type: ignore[no-untyped-def]
        d = Path(tempfile.mkdtemp())
        for rel, text in files.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(text)
        return triage([d])

    flap = verdict({"n3/dmesg": "Nov 30 10:00:00 n3 kernel: mlx5_core 0000:5e:00.0 ens1f0: Link down\n"
                                "Nov 30 10:00:05 n3 kernel: mlx5_core 0000:5e:00.0 ens1f0: Link up\n"})
    down = verdict({"n3/dmesg": "Nov 30 10:00:00 n3 kernel: mlx5_core 0000:5e:00.0 ens1f0: Link down\n"
                                "Nov 30 10:00:01 n3 kernel: mlx5_core 0000:5e:00.0 ens1f0: Link down\n"})
    assert (flap.cls, flap.action) == ("network", "retry"), (flap.cls, flap.action, flap.steps)
    assert (down.cls, down.action) == ("network", "exclude_node_and_restart"), (down.cls, down.action)
    one_off = verdict({"a.log": "step 1 loss 2.0\nstep 2 loss nan\nstep 3 loss 1.9\nstep 4 loss 1.8\n"})
    stuck = verdict({"a.log": "step 1 loss 2.0\nstep 2 loss nan\nstep 3 loss nan\nstep 4 loss nan\n"})
    assert (one_off.cls, one_off.action) == ("numerical", "skip_step"), (one_off.action, one_off.steps)
    assert (stuck.cls, stuck.action) == ("numerical", "fix_code_or_config"), (stuck.action, stuck.steps)


def test_the_flight_recorder_analyser_names_the_missing_rank(tmp_path: Path) -> None:
    (tmp_path / "fr.txt").write_text("Not all ranks joining collective 5 at entry 4\ngroup info: 0:default_pg\n"
                                     "collective: nccl:all_reduce\nmissing ranks: {1}\nexpected ranks: 2\n"
                                     "collective state: scheduled\n")
    (tmp_path / "rank0.log").write_text("[rank0]: RuntimeError: [Rank 0] Watchdog caught collective operation timeout: "
                                        "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600100 ms\n")
    v = triage([tmp_path])
    assert (v.cls, v.culprit["rank"]) == ("hang", 1), (v.cls, v.culprit, v.reason)


def test_a_traceback_ends_in_its_exception_whatever_its_name(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_text(
        "step 3 loss 2.1\nTraceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n"
        "    model = torch.compile(model)(x)\n  File \"/usr/lib/python3/site-packages/torch/_dynamo/eval_frame.py\", "
        "line 451, in _fn\n    return fn(*args)\ntorch._dynamo.exc.Unsupported: call_function BuiltinVariable(open)\n")
    v = triage([tmp_path])
    assert v.cls == "user_code" and v.first_anomaly is not None and v.first_anomaly.line == 7, (
        v.cls, v.first_anomaly, v.reason)
