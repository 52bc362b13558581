"""Message families per class, written from the emitting tools' own sources — old and new phrasings.

Each entry is one message of a real tool in the format its source prints (the version range and the
file are named), behind the prefixes real logs carry. They are not corpus cases: they check that a
rule covers a *family* (every phrasing the tool used across versions), so that a log from a version
nobody here has seen is read the same way. Sources: NVIDIA/nccl (git tags v2.4.8 … master),
pytorch/pytorch (c10d, elastic, DataLoader), SchedMD/slurm, torvalds/linux, Megatron-LM, DeepSpeed,
fairseq, Lightning, libibverbs, Open MPI, pdsh/OpenSSH, the CUDA runtime's and cuBLAS's error strings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from titan.triage import triage

TB = "Traceback (most recent call last):\n  File \"train.py\", line 10, in <module>\n    main()\n"
W = "[E ProcessGroupNCCL.cpp:1] "
N = "node1:1234:1300 [0] "  # NCCL's host:pid:tid [cudaDev] prefix (src/debug.cc)

# family -> (class, action or None when the evidence does not fix it, {file: text})
FAMILIES: dict[str, tuple[str, str | None, dict[str, str]]] = {
    # ---- network: NCCL IB work completions, all four formats (net_ib.cc v2.4-2.7, v2.8-2.19, v2.20-2.27, net_ib/p2p.cc v2.28+)
    "ib_cqe_v2.4": ("network", None, {"a.log": N + "NCCL WARN NET/IB : Got completion with error 12, opcode 0, len 0, vendor err 129\n"}),
    "ib_cqe_v2.12": ("network", None, {"a.log": N + "transport/net_ib.cc:1014 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<45123> with error 12, opcode 0, len 0, vendor err 129\n"}),
    "ib_cqe_v2.21": ("network", None, {"a.log": N + "transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<45123> with status=12 opcode=0 len=0 vendor err 129 (Recv)\n"}),
    "ib_cqe_v2.28": ("network", None, {"a.log": N + "transport/net_ib/p2p.cc:688 NCCL WARN NET/IB: Got completion from peer 10.0.0.2<45123> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) vendor_err=129  hca mlx5_0\n"}),
    # IB async events (ncclIbAsyncThreadMain: v2.4 'Got async event : %s', v2.19 '%s:%d Got async event', v2.28 'async fatal event', 'Got non-fatal async event: %s(%d)')
    "ib_async_v2.4": ("network", None, {"a.log": N + "NCCL WARN NET/IB : Got async event : port error\n"}),
    "ib_async_v2.28_fatal": ("network", None, {"a.log": N + "transport/net_ib/common.cc:123 NCCL WARN NET/IB : mlx5_0:1 async fatal event: local catastrophic error\n"}),
    "ib_async_v2.28_nonfatal": ("network", None, {"a.log": N + "NCCL WARN NET/IB : mlx5_0:1 Got non-fatal async event: port error(10)\n"}),
    "ib_async_v2.28_qp": ("network", None, {"a.log": N + "NCCL WARN NET/IB : mlx5_0:1 async fatal event on QP (0x55) qpn=123 handle=1 send_cq=2 recv_cq=3 state=6 sq_psn=1 rq_psn=2: local work queue catastrophic error\n"}),
    # sockets (misc/socket.cc, os/linux.cc) and UCX
    "socket_connect_v2.28": ("network", None, {"a.log": N + "os/linux.cc:302 NCCL WARN ncclSocketConnect: connect to 10.0.0.2<45678> failed : No route to host\n"}),
    "socket_start_connect": ("network", None, {"a.log": "node2:1:2 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.1<43567> failed : Software caused connection abort\n"}),
    "socket_closed_by_remote": ("network", None, {"a.log": N + "misc/socket.cc:58 NCCL WARN socketProgress: Connection closed by remote peer node2<45678>\n"}),
    "ucx_retry": ("network", None, {"a.log": "[1700000000.123456] [node1:1234:0] ib_mlx5_log.c:171 Transport retry count exceeded on mlx5_0:1/IB (synd 0x15 vend 0x81 hw_synd 0/0)\n"}),
    "efa_ofi_v1.7": ("network", None, {"a.log": N + "NCCL WARN NET/OFI Request 0x7f00001 completed with error. RC: 21. Error: Input/output error. Completed length: 0, Request: { buffer_index: 255, dev: 0, size: 0, state: CREATED, direction: SEND }\n"}),
    "efa_ofi_v1.9": ("network", None, {"a.log": N + "NCCL WARN NET/OFI Request 0x7f00001 (send) completed with error: err: 113, flags: 0, prov_errno: 4118, strerror: Unreachable remote, len: 0\n"}),
    "nccl_system_error_last_error_ib": ("network", None, {"a.log": "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\nncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.\nLast error:\nNET/IB : Got completion from peer 10.0.0.2<45123> with status=12 opcode=0 len=0 vendor err 129 (Recv)\n"}),
    # a system error whose detail is a peer's reset connection is what a dead peer's neighbours report: with no death
    # anywhere the link between them (and a cause on another rank wins: test_formats / test_invariance)
    "nccl_system_error_last_error_reset": ("network", None, {"a.log": "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\nncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.\nLast error:\nsocketProgressOpt: Call to recv from 10.0.0.2<45123> failed : Connection reset by peer\n"}),
    "socket_recv_refused": ("network", None, {"a.log": N + "NCCL WARN Net : Call to recv from 10.0.0.2<45123> failed : Connection refused\n"}),
    "socket_progress_error": ("network", None, {"a.log": N + "NCCL WARN NET/Socket : socket progress error\n"}),
    "ibv_poll_cq": ("network", None, {"a.log": N + "NCCL WARN Call to ibv_poll_cq() returned -1\n"}),
    "mlx5_fw_fatal": ("network", "exclude_node_and_restart", {"dmesg": "[12.3] mlx5_core 0000:3b:00.0: mlx5_fw_fatal_reporter_err_work:696:(pid 1234): Driver is in error state. Unloading\n"}),
    "bonding_slave_down": ("network", "exclude_node_and_restart", {"dmesg": "[12.3] bond0: (slave ens1f0): link status definitely down, disabling slave\n"}),
    "mlx5_module_error": ("network", None, {"dmesg": "Nov 30 10:00:00 n1 kernel: mlx5_core 0000:5e:00.0: mlx5_port_module_event:1132:(pid 0): Port module event[error]: module 0, Cable error, Bus stuck (I2C or data shorted)\n"}),
    # ---- native crashes: where the faulting code lies decides the domain (UCX's fatal-signal handler, ucs/debug/debug.c:
    # 'Caught signal %d (%s)' + '%2d 0x%016lx %s()  %s:%u' frames; gdb's 'Thread N "name" received signal %s, %s.' +
    # '#%d 0x%016lx in %s () from %s'; the kernel's show_signal_msg '%s[%d]: segfault at %lx ip %px sp %px error %lx in %s[%lx+%lx]')
    "ucx_sigsegv_in_program": ("user_code", "fix_code_or_config", {"a.log": "[node3:21877:0:21877] Caught signal 11 (Segmentation fault: address not mapped to object at address 0x8)\n==== backtrace (tid:  21877) ====\n 0 0x0000000000012cf0 __funlockfile()  :0\n 1 0x00000000004f1a2b my_kernel_launch()  /src/ext/ops.cpp:88\n"}),
    "ucx_sigbus_in_nccl_shm": ("comm_error", "fix_code_or_config", {"a.log": "[node3:21877:0:21901] Caught signal 7 (Bus error: nonexistent physical address)\n==== backtrace (tid:  21901) ====\n 0 0x000000000008c3b1 ncclShmOpen()  ???:0\n 1 0x0000000000063dcc ncclProxyService()  ???:0\n"}),
    "gdb_sigsegv_in_nccl_proxy": ("comm_error", "fix_code_or_config", {"gdb.txt": "Thread 12 \"pt_main_thread\" received signal SIGSEGV, Segmentation fault.\n[Switching to Thread 0x7f3a5bfff640 (LWP 4242)]\n(gdb) bt\n#0  0x00007f3a91c2e1f0 in ncclProxyProgress(void*) () from /usr/lib/x86_64-linux-gnu/libnccl.so.2\n#1  0x00007f3ad2494ac3 in start_thread (arg=<optimized out>) at ./nptl/pthread_create.c:442\n"}),
    "kernel_segfault_in_libcuda_dmesg": ("gpu_hardware", "exclude_node_and_restart", {"dmesg": "[ 8123.456789] python3[20411]: segfault at 10 ip 00007f1e2a5b3c1d sp 00007ffd1d2e3f40 error 4 in libcuda.so.535.104.05[7f1e2a200000+2b5c000] likely on CPU 17 (core 1, socket 1)\n"}),
    "kernel_segfault_in_libnvidia_ml": ("gpu_hardware", "exclude_node_and_restart", {"messages": "Jan  5 03:12:44 gpu-n12 kernel: nvidia-smi[9001]: segfault at 0 ip 00007f5c1e0a2b10 sp 00007ffcc2f1a8e0 error 4 in libnvidia-ml.so.550.54.15[7f5c1e000000+1d4000]\n"}),
    "kernel_segfault_in_program": ("user_code", "fix_code_or_config", {"dmesg": "[ 8123.456789] python3[20411]: segfault at 0 ip 000055d1c5b1a2f4 sp 00007ffd1d2e3f40 error 6 in _C.cpython-311-x86_64-linux-gnu.so[7f1e2a200000+2b5c000]\n"}),
    # ---- comm_error: ncclGetErrorString across versions (init.cc), NCCL's setup refusals
    "nccl_error_v2.4_colon": ("comm_error", "fix_code_or_config", {"a.log": "RuntimeError: NCCL error: unhandled system error, NCCL version 2.4.8\n"}),
    "nccl_internal": ("comm_error", "fix_code_or_config", {"a.log": "RuntimeError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191, internal error, NCCL version 2.10.3\n"}),
    "nccl_unhandled_cuda": ("comm_error", None, {"a.log": "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, unhandled cuda error, NCCL version 2.14.3\nncclUnhandledCudaError: Call to CUDA function failed.\n"}),
    "nccl_invalid_argument": ("comm_error", "fix_code_or_config", {"a.log": "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, invalid argument (run with NCCL_DEBUG=WARN for details), NCCL version 2.14.3\n"}),
    "nccl_timeout_result": ("comm_error", None, {"a.log": "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, timeout, NCCL version 2.26.2\n"}),
    "nccl_last_error_shm": ("comm_error", "fix_code_or_config", {"a.log": "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\nncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.\nLast error:\nError while creating shared memory segment /dev/shm/nccl-1234 (size 9637888)\n"}),
    "nccl_multi_rank_gpu": ("comm_error", "fix_code_or_config", {"a.log": N + "init.cc:900 NCCL WARN Multiple Ranks are using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this\n"}),
    "nccl_version_mismatch": ("comm_error", "fix_code_or_config", {"a.log": N + "bootstrap.cc:300 NCCL WARN Mismatched NCCL version detected : rank 0 version 21903 rank 4 version 21805\n"}),
    "nccl_socket_truncated": ("comm_error", "fix_code_or_config", {"a.log": N + "NCCL WARN NET/Socket : peer 10.0.0.2<45678> message truncated : receiving 1048576 bytes instead of 65536. If you believe your socket network is in healthy state, there may be a mismatch in collective sizes or environment settings (e.g. NCCL_PROTO, NCCL_ALGO) between ranks\n"}),
    "nccl_net_count_mismatch": ("comm_error", "fix_code_or_config", {"a.log": N + "init.cc:1 NCCL WARN Detected mixed local Net device counts across ranks (min 4, max 8). Set NCCL_IGNORE_NET_MISMATCH=1 to ignore.\n"}),
    "nccl_no_transport": ("comm_error", "fix_code_or_config", {"a.log": N + "transport.cc:1 NCCL WARN No transport found for rank 0[1b000] -> rank 1[1c000]\n"}),
    "nccl_socket_no_interface": ("comm_error", "fix_code_or_config", {"a.log": N + "NCCL WARN NET/Socket : no interface found\n"}),
    # ---- hang: c10d watchdog messages from torch 1.x to 2.x (ProcessGroupNCCL.cpp), gloo, store, kernel, Slurm
    "watchdog_v1.8": ("hang", None, {"a.log": W + "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800386 milliseconds before timing out.\n"}),
    "blocking_wait_v1.8": ("hang", None, {"a.log": "RuntimeError: [Rank 0] Caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE, TensorShape=[1], Timeout(ms)=1800000) ran for 1800054 milliseconds before timing out.\n"}),
    "watchdog_v2.4_terminated": ("hang", None, {"a.log": "[rank1]:[E1130 09:00:00.000000000 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=11, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n"}),
    "dump_signal_v2.3": ("hang", None, {"a.log": "[rank0]:[E1130 09:00:00.000 ProcessGroupNCCL.cpp:1] [PG ID 0 PG GUID 0(default_pg) Rank 0] Received a dump signal due to a collective timeout from  rank 3 and we will try our best to dump the debug info. Last enqueued NCCL work: 10, last completed NCCL work: 9.\n"}),
    "watchdog_terminate_timeout_v2.4": ("hang", None, {"a.log": "[rank3]:[F1130 09:48:00.000 ProcessGroupNCCL.cpp:1] [PG ID 0 PG GUID 0(default_pg) Rank 3] Terminating the process after attempting to dump debug info, due to collective timeout or exception.\n"}),
    "heartbeat_terminate_v2.3": ("hang", "restart_from_checkpoint", {"a.log": "[rank2]:[F1130 09:00:00.000 ProcessGroupNCCL.cpp:1] [PG ID 0 PG GUID 0(default_pg) Rank 2] Terminating the process after attempting to dump debug info, due to ProcessGroupNCCL watchdog hang.\n"}),
    "store_wait_timeout": ("hang", None, {"a.log": "torch.distributed.DistStoreError: wait timeout after 300000ms, keys: /default_pg/0//cuda//0\n"}),
    "gloo_recv_timeout": ("hang", None, {"a.log": "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation to complete\n"}),
    "lightning_interrupt": ("hang", None, {"a.log": "Epoch 3:  45%|####5     | 450/1000 [10:00<12:13, 1.33s/it]\nDetected KeyboardInterrupt, attempting graceful shutdown ...\n"}),
    "slurm_not_ending_with_signals": ("hang", "restart_from_checkpoint", {"a.log": "slurmstepd: error: *** JOB 1234 STEPD TERMINATED ON node17 AT 2024-01-01T10:00:00 DUE TO JOB NOT ENDING WITH SIGNALS ***\n"}),
    "kernel_soft_lockup": ("hang", "restart_from_checkpoint", {"dmesg": "[12345.678] watchdog: BUG: soft lockup - CPU#12 stuck for 23s! [python:4321]\n"}),
    "pyspy_odd_one_in_io": ("hang", None, {"dump.txt": "".join(f"Process {p}: python train.py\nThread {p} (active): \"MainThread\"\n    all_reduce (torch/distributed/distributed_c10d.py:2000)\n    step (train.py:50)\n\n" for p in (100, 101, 102)) + "Process 103: python train.py\nThread 103 (active): \"MainThread\"\n    save (torch/serialization.py:600)\n    checkpoint (train.py:70)\n"}),
    # Horovod's stall inspector (horovod/common/stall_inspector.cc): some ranks submitted a tensor, the rest never did
    "horovod_stall": ("hang", None, {"a.log": "[2024-01-01 10:00:00.000000: W /tmp/pip/horovod/common/stall_inspector.cc:107] One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are waiting for remainder of ranks for more than 60 seconds. This may indicate that different ranks are trying to submit different tensors or that only subset of ranks is submitting tensors, which will cause deadlock. \nMissing ranks:\n1: [DistributedAdam_Allreduce/cond/HorovodAllreduce_grads_0]\n"}),
    # the watchdog line as people quote it: cut after "timeout" (a wrapped terminal, a summary) or its WorkNCCL elided
    "watchdog_head_only": ("hang", None, {"a.log": "    Watchdog caught collective operation timeout\n    checkTimeout at ProcessGroupNCCL.cpp:733\n"}),
    "watchdog_description_elided": ("hang", None, {"a.log": W + "[Rank 2] Watchdog caught collective operation timeout: WorkNCCL(... OpType=ALLGATHER ...) ran for 1800093 milliseconds before timing out.\n"}),
    # ---- numerical: autograd anomaly mode (engine.cpp, the function's name quoted), Lightning's finite checks
    "anomaly_mode_quoted": ("numerical", None, {"a.log": TB + "RuntimeError: Function 'LogSoftmaxBackward0' returned nan values in its 0th output.\n"}),
    "lightning_check_finite_loss": ("numerical", None, {"a.log": TB + "ValueError: The loss returned in `training_step` is tensor(nan, device='cuda:0', grad_fn=<MeanBackward0>).\n"}),
    "lightning_check_finite_loss_old": ("numerical", None, {"a.log": TB + "ValueError: The loss returned in `training_step` is nan or inf.\n"}),
    "lightning_detect_nan_parameters": ("numerical", None, {"a.log": TB + "ValueError: Detected nan and/or inf values in `layer.weight`. Check your forward pass for numerically unstable operations.\n"}),
    # ---- launcher: slurmstepd cannot exec the task (task.c)
    # TCPStore::waitForWorkers on the store's host: peers that never connected (a RuntimeError before torch 2.2)
    # torch 1.x c10d tcputil::connect: the store's address never answered
    "c10d_connect_timed_out_v1": ("launcher", "fix_code_or_config", {"a.log": TB + "RuntimeError: connect() timed out. Original timeout was 1800000 ms.\n"}),
    "tcpstore_wait_for_workers_old": ("launcher", "retry", {"a.log": TB + "RuntimeError: Timed out after 1801 seconds waiting for clients. 1/2 clients joined.\n"}),
    "slurmstepd_execve": ("launcher", "fix_code_or_config", {"a.log": "slurmstepd: error: execve(): python: No such file or directory\nsrun: error: node17: task 0: Exited with exit code 2\n"}),
    # ---- storage: errnos, the kernel's block/fs layers (4.x-6.x), Lustre, truncated files
    "pickle_truncated": ("storage", "restart_from_checkpoint", {"a.log": TB + "  File \"torch/serialization.py\", line 1, in load\n_pickle.UnpicklingError: pickle data was truncated\n"}),
    "enotconn_fuse": ("storage", None, {"a.log": "OSError: [Errno 107] Transport endpoint is not connected: '/mnt/gcs/data/shard-00012.tar'\n"}),
    "edquot": ("storage", "fix_code_or_config", {"a.log": "OSError: [Errno 122] Disk quota exceeded\n"}),
    "erofs": ("storage", "fix_code_or_config", {"a.log": "OSError: [Errno 30] Read-only file system: '/data/ckpt'\n"}),
    "blk_v6": ("storage", "exclude_node_and_restart", {"dmesg": "[1234.5] I/O error, dev nvme0n1, sector 123456 op 0x1:(WRITE) flags 0x800 phys_seg 1 prio class 0\n"}),
    "blk_v4": ("storage", "exclude_node_and_restart", {"dmesg": "[1234.5] blk_update_request: I/O error, dev sda, sector 2048\n"}),
    "ext4_remount_ro": ("storage", "exclude_node_and_restart", {"dmesg": "[1234.5] EXT4-fs (nvme0n1p1): Remounting filesystem read-only\n"}),
    "xfs_shutdown": ("storage", "exclude_node_and_restart", {"dmesg": "[1234.5] XFS (md0): log I/O error -5\n[1234.6] XFS (md0): Filesystem has been shut down due to log error (0x2).\n"}),
    "nvme_timeout": ("storage", "exclude_node_and_restart", {"dmesg": "[1234.5] nvme nvme0: I/O 123 QID 4 timeout, aborting\n"}),
    "lustre_connection_lost": ("storage", "restart_from_checkpoint", {"dmesg": "[1234.5] Lustre: scratch-OST0012-osc-ffff: Connection to scratch-OST0012 (at 10.1.1.2@o2ib) was lost; in progress operations using this service will wait for recovery to complete\n"}),
    "lustre_error": ("storage", "restart_from_checkpoint", {"dmesg": "[1234.5] LustreError: 11-0: scratch-MDT0000-mdc-ffff: operation mds_getattr to node 10.1.1.1@o2ib failed: rc = -107\n"}),
    "nfs_timed_out": ("storage", "restart_from_checkpoint", {"dmesg": "[1234.5] nfs: server filer01 not responding, timed out\n"}),
    "torch_load_eof": ("storage", "restart_from_checkpoint", {"a.log": "RuntimeError: unexpected EOF, expected 1234 more bytes. The file might be corrupted.\n"}),
    "stream_reader_corrupt": ("storage", "restart_from_checkpoint", {"a.log": "RuntimeError: PytorchStreamReader failed reading file data/12: invalid header or archive is corrupted\n"}),
    "bad_zip": ("storage", None, {"a.log": "zipfile.BadZipFile: File is not a zip file\n"}),
    "hdf5_truncated": ("storage", None, {"a.log": "OSError: Unable to open file (truncated file: eof = 123456, sblock->base_addr = 0, stored_eof = 999999)\n"}),
    "dataloader_bus_error": ("storage", "fix_code_or_config", {"a.log": TB + "RuntimeError: DataLoader worker (pid 1234) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory. Please try to raise your shared memory limit.\n"}),
    # ---- oom: the kernel OOM killer before/after 4.19, Slurm's memory limit, GPU libraries' allocation failures
    "oom_killer_pre_4.19": ("oom", "fix_code_or_config", {"dmesg": "[1234.5] Out of memory: Kill process 4321 (python) score 900 or sacrifice child\n[1234.5] Killed process 4321 (python) total-vm:123kB, anon-rss:456kB, file-rss:0kB\n"}),
    "oom_cgroup_pre_4.19": ("oom", "fix_code_or_config", {"dmesg": "[1234.5] Memory cgroup out of memory: Kill process 4321 (python) score 1000 or sacrifice child\n"}),
    "slurm_exceeded_memory": ("oom", "fix_code_or_config", {"a.log": "slurmstepd: error: Job 1234 exceeded memory limit (123456789 > 100000000), being killed\n"}),
    "slurm_step_exceeded_memory": ("oom", "fix_code_or_config", {"a.log": "slurmstepd: error: StepId=1234.0 exceeded memory limit (123456789 > 100000000), being killed\n"}),
    "cublas_alloc_failed": ("oom", "fix_code_or_config", {"a.log": "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`\n"}),
    "hip_oom": ("oom", "fix_code_or_config", {"a.log": "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 191.98 GiB of which 1.02 GiB is free.\n"}),
    "cuda_oom_v1": ("oom", "fix_code_or_config", {"a.log": "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 10.76 GiB total capacity; 9.80 GiB already allocated; 3.56 MiB free; 9.88 GiB reserved in total by PyTorch)\n"}),
    # Ray's memory monitor (raylet node_manager.cc; exceptions.py OutOfMemoryError): host memory of that node
    "ray_memory_monitor_raylet": ("oom", "fix_code_or_config", {"a.log": "(raylet) [2024-01-01 10:00:00,000 E 123 123] (raylet) node_manager.cc:3040: 1 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: 9f3c, IP: 10.0.0.4) over the last time period.\n"}),
    "ray_memory_monitor_task": ("oom", "fix_code_or_config", {"a.log": "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\nMemory on the node (IP: 10.0.0.4, ID: 9f3c) where the task (actor ID: 1a2b, pid=2211, memory used=120.5GB) was running was 240.00GB / 251.50GB (0.954), which exceeds the memory usage threshold of 0.95.\n"}),
    "cpu_allocator_v2": ("oom", "fix_code_or_config", {"a.log": TB + "RuntimeError: [enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: not enough memory: you tried to allocate 68719476736 bytes.\n"}),
    # ---- numerical: loss-scale floors (DeepSpeed, fairseq), overflow skips, Megatron's NaN checks, clipping
    "fairseq_min_loss_scale": ("numerical", "fix_code_or_config", {"a.log": "FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding. Try lowering the learning rate, using gradient clipping or increasing the batch size.\n"}),
    "ds_overflow_old_wording": ("numerical", None, {"a.log": "[2023-01-01 10:00:00,000] [INFO] [fused_optimizer.py:171:step] [deepspeed] fp16 dynamic loss scale overflow! Skipping step. Attempted loss scale: 4294967296, reducing to 2147483648\n"}),
    "clip_grad_nonfinite": ("numerical", None, {"a.log": "RuntimeError: The total norm of order 2.0 for gradients from `parameters` is non-finite, so it cannot be clipped. To disable this error and scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=False`\n"}),
    "megatron_rerun_nan": ("numerical", None, {"a.log": "RuntimeError: Rank 3, node gpu-node-07, device 3, iteration 1201: Unexpected result nan (message='found NaN in local grad norm for bucket #0 in backward pass before data-parallel communication collective')\n"}),
    "megatron_legacy_nan": ("numerical", None, {"a.log": "AssertionError: Rank 5: found NaN in local grad norm in backward pass before data-parallel communication collective. Device: 5, node: gpu-node-02\n"}),
    "megatron_lm_loss_nan": ("numerical", None, {"a.log": " iteration      100/  1000 | lm loss: 2.1E+00 | loss scale: 1.0 |\n iteration      110/  1000 | lm loss: NAN | loss scale: 1.0 | number of nan iterations:   1 |\n"}),
    # ---- launcher: Slurm (slurmstepd req.c, srun), rendezvous, pdsh/ssh, Open MPI
    "slurm_requeue": ("launcher", "restart_from_checkpoint", {"a.log": "slurmstepd: error: *** JOB 1234 ON node1 CANCELLED AT 2024-01-01T10:00:00 DUE TO JOB REQUEUE ***\n"}),
    "srun_step_create": ("launcher", "fix_code_or_config", {"a.log": "srun: error: Unable to create step for job 1234: Memory required by task is not available\n"}),
    "srun_task_launch": ("launcher", None, {"a.log": "srun: error: Task launch for StepId=1234.0 failed on node node7: Invalid job credential\n"}),
    "pdsh_ssh_255": ("launcher", "fix_code_or_config", {"a.log": "node2: ssh: connect to host node2 port 22: Connection refused\npdsh@node1: node2: ssh exited with exit code 255\n"}),
    "orte_daemons": ("launcher", "fix_code_or_config", {"a.log": "ORTE was unable to reliably start one or more daemons.\n"}),
    "etcd_rendezvous": ("launcher", None, {"a.log": "RuntimeError: Rendezvous timeout occurred in EtcdRendezvousHandler\n"}),
    "bind_errno_98": ("launcher", "fix_code_or_config", {"a.log": "RuntimeError: The server socket has failed to listen on any local network address. The server socket has failed to bind to 0.0.0.0:29500 (errno: 98 - Address already in use).\n"}),
    # ---- gpu_hardware: CUDA's hardware error strings (old 'cuda runtime error (N) :' form too), Megatron's rerun verdict
    "cuda_nvlink_uncorrectable": ("gpu_hardware", "exclude_node_and_restart", {"a.log": "RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution\n"}),
    "cuda_runtime_error_v1.4": ("gpu_hardware", "exclude_node_and_restart", {"a.log": "RuntimeError: cuda runtime error (214) : uncorrectable NVLink error detected during the execution\n"}),
    "cuda_system_not_ready": ("gpu_hardware", "exclude_node_and_restart", {"a.log": "RuntimeError: CUDA error: system not yet initialized\n"}),
    "megatron_sdc": ("gpu_hardware", "exclude_node_and_restart", {"a.log": "Second rerun: unexpected result is not reproducible on a different GPU, therefore was likely incorrect (nan != 2.1)\nRank 3, node gpu-node-07, device 3, iteration #1201: Possible persistent error!!\n"}),
    # the driver's clean-up (Xid 45 preemptive cleanup, 109 context-switch timeout) alone: that GPU, its cause unseen
    "xid_cleanup_alone": ("gpu_hardware", None, {"dmesg": "[Tue Nov 30 10:00:00 2026] NVRM: Xid (PCI:0000:3b:00): 109, pid=1234, name=python, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x1c039\n"}),
    "xid_94_new_driver": ("gpu_hardware", "exclude_node_and_restart", {"dmesg": "[12.3] NVRM: Xid (PCI:0000:3b:00): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No\n"}),
    # NCCL's own CUDA checks (checks.h CUDACHECK "Cuda failure '%s'", cudawrap.h CUCHECK "Cuda failure %d '%s'") with a
    # device-failure string: the GPU, as the framework's "CUDA error: …" with the same string (a copy may lose the quote)
    "nccl_cucheck_unknown": ("gpu_hardware", "exclude_node_and_restart", {"a.log": N + "transport/nvls.cc:223 NCCL WARN Cuda failure 999 'unknown error'\n"}),
    "nccl_cudacheck_not_ready": ("gpu_hardware", "exclude_node_and_restart", {"a.log": N + "init.cc:99 NCCL WARN Cuda failure 'system not yet initialized'\n"}),
    "nccl_cucheck_launch_cut": ("gpu_hardware", "exclude_node_and_restart", {"a.log": N + "enqueue.cc:1 NCCL WARN Cuda failure 719 'unspecified launch failure\n"}),
    # c10d's own teardown (WorkNCCL::handleException, formerly handleNCCLGuard), then the abort it causes: a communication
    # failure or timeout taken as fatal, not a crash of the program's native code
    "c10d_teardown_then_abort": ("comm_error", None, {"a.log": "[E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data. To avoid data inconsistency, we are taking the entire process down.\nAborted (core dumped)\n"}),
    # gdb on the core file (corelow.c 'Program terminated with signal %s, %s.') and its native backtrace
    "gdb_core_c10d_teardown": ("comm_error", None, {"core_bt.txt": "Core was generated by `/usr/bin/python -u train.py'.\nProgram terminated with signal SIGABRT, Aborted.\n#0  __pthread_kill_implementation (no_tid=0, signo=6, threadid=1) at ./nptl/pthread_kill.c:44\n#1  0x00007f8e1f096859 in __GI_abort () at abort.c:79\n#2  0x00007f8e0f8b03f7 in std::terminate() () from /lib/x86_64-linux-gnu/libstdc++.so.6\n#3  0x00007f8d8a2b7c4f in c10d::ProcessGroupNCCL::WorkNCCL::handleNCCLGuard(c10d::ErrorHandlingMode) () from /opt/conda/lib/python3.8/site-packages/torch/lib/libtorch_cuda_cpp.so\n#4  0x00007f8d8a2bb4a0 in c10d::ProcessGroupNCCL::workCleanupLoop() () from /opt/conda/lib/python3.8/site-packages/torch/lib/libtorch_cuda_cpp.so\n#5  0x00007f8e1f193133 in clone () from /lib/x86_64-linux-gnu/libc.so.6\n"}),
    "gdb_core_segv": ("user_code", "fix_code_or_config", {"core_bt.txt": "Core was generated by `/usr/bin/python -u train.py'.\nProgram terminated with signal SIGSEGV, Segmentation fault.\n#0  0x00007f3c5d2a1b40 in ?? () from /opt/conda/lib/python3.10/site-packages/my_ext.so\n"}),
    # ---- launcher: Slurm's queue and accounting (squeue reason codes, sacct job states)
    "squeue_launch_failed_held": ("launcher", "retry", {"squeue.txt": "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)\n            137849       gpu    train    alice PD       0:00      4 (launch failed requeued held)\n"}),
    "scontrol_launch_failed_held": ("launcher", "retry", {"job.txt": "JobId=137849 JobName=train\n   JobState=PENDING Reason=launch_failed_requeued_held Dependency=(null)\n"}),
    "squeue_job_launch_failure": ("launcher", "retry", {"squeue.txt": "            137850       gpu    train    alice PD       0:00      2 (JobLaunchFailure)\n"}),
    "sacct_timeout": ("launcher", "restart_from_checkpoint", {"sacct.txt": "JobID           JobName  Partition    Account  AllocCPUS      State ExitCode \n------------ ---------- ---------- ---------- ---------- ---------- -------- \n4242              train        gpu       proj         64    TIMEOUT      0:0 \n4242.batch        batch                  proj         32  CANCELLED     0:15 \n"}),
    "sacct_preempted": ("launcher", "restart_from_checkpoint", {"sacct.txt": "4243              train        gpu       proj         64  PREEMPTED      0:0 \n"}),
    "sacct_boot_fail": ("launcher", "exclude_node_and_restart", {"sacct.txt": "4244              train        gpu       proj         64  BOOT_FAIL      0:0 \n"}),
    "squeue_node_down": ("launcher", "exclude_node_and_restart", {"squeue.txt": "            137851       gpu    train    alice PD       0:00      2 (NodeDown)\n"}),
    # ---- network: `rdma link` (iproute2) port states — not up; and a later snapshot with the same port up (a flap)
    "rdma_link_polling": ("network", "exclude_node_and_restart", {"rdma.txt": "link mlx5_0/1 subnet_prefix fe80:0000:0000:0000 lid 7 sm_lid 1 lmc 0 state ACTIVE physical_state LINK_UP netdev ib0\nlink mlx5_1/1 subnet_prefix fe80:0000:0000:0000 lid 65535 sm_lid 0 lmc 0 state DOWN physical_state POLLING netdev ib1\n"}),
    "rdma_link_old_format": ("network", "exclude_node_and_restart", {"rdma.txt": "1/1: mlx5_0/1: subnet_prefix fe80:0000:0000:0000 lid 7 sm_lid 1 lmc 0 state INIT physical_state LINK_UP \n"}),
    "rdma_link_flap": ("network", "retry", {"rdma.txt": "link mlx5_1/1 state DOWN physical_state POLLING netdev ens1f1\nlink mlx5_0/1 state ACTIVE physical_state LINK_UP netdev ens1f0\nlink mlx5_1/1 state ACTIVE physical_state LINK_UP netdev ens1f1\n"}),
    # ---- user_code: Megatron's start-up check of the run's arguments against the checkpoint it resumes (the assertion's
    # message as people quote it, without the traceback; inside one, the AssertionError line reads the same)
    "megatron_annealinglr_mismatch": ("user_code", "fix_code_or_config", {"a.log": "AnnealingLR: class input valueand checkpoint values for learning rate do not match\n"}),
    "megatron_opt_scheduler_mismatch": ("user_code", "fix_code_or_config", {"a.log": "OptimizerParamScheduler: class input value 640 and checkpointvalue 384 for total number of weight decay iterations do not match\n"}),
    "megatron_checkpoint_args": ("user_code", "fix_code_or_config", {"a.log": "num_layers value from checkpoint (24) is not equal to the input argument value (32).\n"}),
    # ---- user_code: CUDA's program-error strings; a device the process cannot see is its configuration
    "cuda_no_device": ("user_code", "fix_code_or_config", {"a.log": "RuntimeError: CUDA error: no CUDA-capable device is detected\n"}),
    "cuda_no_kernel_image": ("user_code", "fix_code_or_config", {"a.log": "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"}),
    "ddp_unused_parameters": ("user_code", "fix_code_or_config", {"a.log": "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This error indicates that your module has parameters that were not used in producing loss.\n"}),
}


def _triage(files: dict[str, str], root: Path):  # type: ignore[no-untyped-def]
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return triage([root])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_phrasing_of_a_message_family_is_read_as_its_class(family: str, tmp_path: Path) -> None:
    cls, action, files = FAMILIES[family]
    v = _triage(files, tmp_path)
    assert v.cls == cls, f"{family}: expected {cls}, got {v.cls} ({v.reason})"
    assert v.first_anomaly is not None and v.first_anomaly.rule != "lexical", (
        f"{family}: read by the last-resort word vote, not by a rule of its message ({v.reason})")
    if action:
        assert v.action == action, f"{family}: expected action {action}, got {v.action} ({v.steps[-1]})"


def test_identity_from_foreign_prefixes(tmp_path: Path) -> None:
    """Lightning's [rank: N], Accelerate's [RANK N], kubectl's [pod/…], Ray's ip=, Megatron's 'node X'."""
    cases = {
        "lightning": ("[rank: 3] RuntimeError: shape mismatch\n", {"rank": 3}),
        "accelerate": ("[RANK 5] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n", {"rank": 5}),
        "kubectl": ("[pod/trainer-worker-3/pytorch] torch.OutOfMemoryError: CUDA out of memory.\n",
                    {"node": "trainer-worker-3"}),
        "ray": ("(RayTrainWorker pid=2211, ip=10.0.0.4) torch.OutOfMemoryError: CUDA out of memory.\n",
                {"node": "10.0.0.4"}),
        # UCX's log/error-handler prefix "[host:pid:thread:tid]" (ucs/debug/log.c), the pid padded to five columns
        "ucx_prefix": ("[trn-node-17:3039 :0:3095] Caught signal 11 (Segmentation fault: address not mapped to object at "
                       "address (nil))\n", {"node": "trn-node-17"}),
        "megatron": ("RuntimeError: Rank 3, node gpu-node-07, device 3, iteration 1201: Unexpected result nan "
                     "(message='found NaN in local grad norm for bucket #0')\n", {"rank": 3, "node": "gpu-node-07"}),
        # Open MPI's mpirun --tag-output "[jobid,rank]<stream>:" and horovodrun's "[rank]<stream>:" (the world rank)
        "openmpi_tag_output": ("[1,0]<stdout>:step 1 loss 2.0\n[1,3]<stderr>:Traceback (most recent call last):\n"
                               "[1,3]<stderr>:  File \"t.py\", line 1, in <module>\n"
                               "[1,3]<stderr>:torch.OutOfMemoryError: CUDA out of memory.\n", {"rank": 3}),
        "horovodrun": ("[0]<stdout>:step 1 loss 2.0\n[2]<stderr>:Traceback (most recent call last):\n"
                       "[2]<stderr>:torch.OutOfMemoryError: CUDA out of memory.\n", {"rank": 2}),
        # Ray's remote-error header names the worker's node; the traceback under it is that worker's
        "ray_task_error": ("ray.exceptions.RayTaskError(ValueError): ray::WorkerDict.update_actor() (pid=2211, "
                           "ip=10.0.0.4, actor_id=1a2b)\n  File \"workers.py\", line 1, in update_actor\n"
                           "ValueError: labels and logits differ in length\n", {"node": "10.0.0.4"}),
        "ray_task_error_oom": ("ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.update_actor() (pid=2211, "
                               "ip=10.0.0.4)\n  File \"workers.py\", line 1, in update_actor\n"
                               "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n", {"node": "10.0.0.4"}),
        # torch.multiprocessing.spawn: the traceback after "-- Process N terminated with the following error:" is N's
        "mp_spawn": ("Traceback (most recent call last):\n  File \"t.py\", line 30, in <module>\n    mp.spawn(main, nprocs=4)\n"
                     "torch.multiprocessing.spawn.ProcessRaisedException: \n\n-- Process 2 terminated with the following "
                     "error:\nTraceback (most recent call last):\n  File \"torch/multiprocessing/spawn.py\", line 69, in _wrap\n"
                     "    fn(i, *args)\ntorch.OutOfMemoryError: CUDA out of memory.\n", {"rank": 2}),
    }
    for name, (text, want) in cases.items():
        d = tmp_path / name
        v = _triage({"a.log": text}, d)
        got = {k: v.culprit.get(k) for k in want}
        assert got == want, f"{name}: culprit {v.culprit}, expected {want} ({v.reason})"


def test_the_rank_absent_from_a_collective_is_named_even_when_no_line_of_it_is_in_the_logs(tmp_path: Path) -> None:
    """Ranks count from 0: with ranks 1..3 timing out and rank 0 silent, rank 0 is the one they wait for."""
    def wd(r: int) -> str:
        return (f"[rank{r}]:[E1130 09:10:00.000 ProcessGroupNCCL.cpp:1] [Rank {r}] Watchdog caught collective operation "
                f"timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600100 "
                "milliseconds before timing out.\n")
    for reporting, absent in (((1, 2, 3), 0), ((0, 1, 3), 2)):
        v = _triage({"a.log": "".join(wd(r) for r in reporting)}, tmp_path / str(absent))
        assert (v.cls, v.culprit["rank"]) == ("hang", absent), (v.cls, v.culprit, v.reason)


def test_fabric_errors_that_all_name_one_peer_blame_that_peer(tmp_path: Path) -> None:
    """Three nodes report IB errors against 10.0.0.4; NCCL's bootstrap lines say that address is n4."""
    boot = "".join(f"n{i}:1:2 [0] NCCL INFO Bootstrap : Using ib0:10.0.0.{i}<0>\n" for i in range(1, 5))
    errs = "".join(f"n{i}:1:2 [0] transport/net_ib.cc:1 NCCL WARN NET/IB : Got completion from peer 10.0.0.4<4444> "
                   "with error 12, opcode 0, len 0, vendor err 129\n" for i in range(1, 4))
    v = _triage({"a.log": boot + errs}, tmp_path)
    assert (v.cls, v.culprit["node"], v.action) == ("network", "n4", "exclude_node_and_restart"), (
        v.cls, v.culprit, v.action, v.reason)


def _wd(r: int, op: str = "ALLREDUCE", numel: int = 1, seq: int = 9) -> str:
    return (f"[rank{r}]:[E1130 09:10:00.000 ProcessGroupNCCL.cpp:1] [Rank {r}] Watchdog caught collective operation "
            f"timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, Timeout(ms)=600000) ran "
            "for 600100 milliseconds before timing out.\n")


def test_the_rank_in_another_collective_than_all_the_others_is_the_one_that_diverged(tmp_path: Path) -> None:
    """Ranks 0-2 time out in an ALLGATHER, rank 3 in an ALLREDUCE of another size: rank 3's control flow diverged."""
    text = "".join(_wd(r, "_ALLGATHER_BASE", 4096) for r in (0, 1, 2)) + _wd(3, "ALLREDUCE", 1)
    v = _triage({"a.log": text}, tmp_path)
    assert (v.cls, v.culprit["rank"]) == ("hang", 3), (v.cls, v.culprit, v.reason)


def test_sequence_numbers_of_different_process_groups_are_not_compared(tmp_path: Path) -> None:
    """[rank13] times out at SeqNum 216 of a sub-group ([Rank 1]), [rank15] at 57 of another: no one is 'behind'."""
    text = ("[rank13]:[E218 04:54:22.8 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=216, OpType=ALLTOALL_BASE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran for 600045 ms\n"
            "[rank15]:[E218 04:54:22.8 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=57, OpType=ALLREDUCE, NumelIn=32, NumelOut=32, Timeout(ms)=600000) ran for 600045 ms\n")
    v = _triage({"a.log": text}, tmp_path)
    assert v.cls == "hang" and "SeqNum" not in v.reason, (v.culprit, v.reason)


def test_when_every_rank_timed_out_the_rank_whose_progress_stopped_first_is_named(tmp_path: Path) -> None:
    prog = "".join(f"[rank{r}]: step {s} loss 2.0\n" for r in (0, 1, 2, 3) for s in range(1, 6 if r != 2 else 4))
    v = _triage({"a.log": prog + "".join(_wd(r) for r in (0, 1, 2, 3))}, tmp_path)
    assert (v.cls, v.culprit["rank"]) == ("hang", 2), (v.cls, v.culprit, v.reason)


def test_on_one_node_an_oom_without_a_rank_prefix_is_the_rank_of_its_gpu(tmp_path: Path) -> None:
    v = _triage({"a.log": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 5 has a total "
                          "capacity of 79.1 GiB of which 1.0 GiB is free.\n"}, tmp_path)
    assert (v.cls, v.culprit["rank"], v.culprit["gpu"]) == ("oom", 5, "5"), (v.cls, v.culprit, v.reason)


def test_a_peer_loss_inside_an_nccl_error_loses_to_the_cause_on_the_rank_that_died(tmp_path: Path) -> None:
    """Rank 0's NCCL system error says its socket to a peer was reset; rank 1 ran out of memory: the OOM is the cause."""
    v = _triage({"r0.log": "[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                           "ProcessGroupNCCL.cpp:1970, unhandled system error, NCCL version 2.19.3\n[rank0]: Last error:\n"
                           "[rank0]: socketProgressOpt: Call to recv from 10.0.0.2<45123> failed : Connection reset by peer\n",
                 "r1.log": "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"}, tmp_path)
    assert (v.cls, v.culprit["rank"]) == ("oom", 1), (v.cls, v.culprit, v.reason)


def test_a_non_finite_value_is_a_one_off_only_when_healthy_steps_come_before_it(tmp_path: Path) -> None:
    """Healthy steps then one NaN: skip it. A lone NaN with nothing around it: nothing shows a one-off, fix the setup."""
    sudden = _triage({"a.log": "step 1 loss 2.0\nstep 2 loss 1.9\nstep 3 loss 1.8\nFloatingPointError: non-finite loss nan at "
                               "step 4\n"}, tmp_path / "sudden")
    lone = _triage({"a.log": "FloatingPointError: non-finite loss nan at step 4\n"}, tmp_path / "lone")
    assert (sudden.cls, sudden.action) == ("numerical", "skip_step"), (sudden.action, sudden.steps)
    assert (lone.cls, lone.action) == ("numerical", "fix_code_or_config"), (lone.action, lone.steps)


def test_a_warning_the_job_got_past_is_not_the_failure(tmp_path: Path) -> None:
    """An NCCL WARN during init, then init completes and training runs: the later OOM is the failure, not the warning.

    A c10d store-connect retry, then a collective timeout: the process group was formed (the store was reached), so the
    stall is the timeout's (hang), not the launcher's."""
    nccl = _triage({"a.log": N + "NCCL WARN Could not find real path of /sys/class/net/ib0/device\n"
                             + N + "NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1b000 - Init COMPLETE\n"
                             "step 1 loss 2.0\nstep 2 loss 1.9\n"
                             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"}, tmp_path / "nccl")
    assert nccl.cls == "oom", (nccl.cls, nccl.reason)
    retry = _triage({"a.log": "[W1130 09:00:00.000 socket.cpp:464] [c10d] The client socket has failed to connect to "
                              "[node1]:29500 (errno: 111 - Connection refused).\n" + _wd(1)}, tmp_path / "retry")
    assert retry.cls == "hang", (retry.cls, retry.reason)


def test_a_rankless_error_before_a_summary_of_one_failed_process_is_that_process_s(tmp_path: Path) -> None:
    """torchrun's console without --tee: the worker's traceback carries no prefix; the summary says only rank 10 failed."""
    text = ("Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\nValueError: bad shape\n"
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 2 (pid: 4321) of binary: "
            "/usr/bin/python\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n" + "=" * 60 + "\n"
            "train.py FAILED\n" + "-" * 60 + "\nFailures:\n  <NO_OTHER_FAILURES>\n" + "-" * 60 + "\n"
            "Root Cause (first observed failure):\n[0]:\n  time      : 2024-01-01_10:00:00\n  host      : gpu-node-3\n"
            "  rank      : 10 (local_rank: 2)\n  exitcode  : 1 (pid: 4321)\n  error_file: <N/A>\n"
            "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n" + "=" * 60 + "\n")
    v = _triage({"console.log": text}, tmp_path)
    assert (v.cls, v.culprit["rank"], v.culprit["node"]) == ("user_code", 10, "gpu-node-3"), (v.cls, v.culprit, v.reason)
    assert "summary" in v.reason, v.reason


def test_the_same_step_non_finite_again_after_a_restart_is_fixed_not_skipped(tmp_path: Path) -> None:
    """Step 100 goes NaN, the job resumes from step 90 and step 100 goes NaN again: deterministic, not a one-off.

    The same NaN line logged twice with no earlier step between (no restart) stays a one-off."""
    def steps(lo: int, hi: int, minute: int) -> str:
        return "".join(f"2024-01-01 10:{minute:02d}:{s - lo:02d} step {s} loss {2.0 - s * 0.01:.3f}\n" for s in range(lo, hi))

    nan1 = "2024-01-01 10:01:40 step 100 loss nan\n"
    resumed = _triage({"a.log": steps(90, 100, 0) + nan1 + "2024-01-01 10:05:00 Resuming from checkpoint at step 90\n"
                                + steps(90, 100, 6) + "2024-01-01 10:07:40 step 100 loss nan\n"}, tmp_path / "again")
    twice = _triage({"a.log": steps(90, 100, 0) + nan1 + nan1 + steps(101, 110, 2)}, tmp_path / "twice")
    assert (resumed.cls, resumed.action) == ("numerical", "fix_code_or_config"), (resumed.action, resumed.steps)
    assert (twice.cls, twice.action) == ("numerical", "skip_step"), (twice.action, twice.steps)


def _spy(pid: int, frames: list[str], name: str = "MainThread", header: bool = True, tid: str | None = None) -> str:
    """One process's ``py-spy dump`` (py-spy src/dump.rs: 'Process %d: %s', 'Thread %s (%s): "%s"', '    %s (%s:%d)')."""
    head = f"Process {pid}: /usr/bin/python -u train.py\nPython v3.10.12 (/usr/bin/python3.10)\n\n" if header else ""
    return head + f"Thread {tid or pid} (active): \"{name}\"\n" + "".join(f"    {f}\n" for f in frames)


_WAIT = ["all_reduce (torch/distributed/distributed_c10d.py:2050)", "step (train.py:50)", "<module> (train.py:90)"]
_SAVE = ["write (torch/serialization.py:600)", "save (train.py:70)", "<module> (train.py:90)"]


def _pybt(frames: list[tuple[str, int, str]]) -> str:
    """gdb's py-bt (CPython Tools/gdb/libpython.py): 'Traceback (most recent call first):' + '  File "%s", line %i, in %s'."""
    return "Traceback (most recent call first):\n" + "".join(f'  File "{f}", line {n}, in {fn}\n' for f, n, fn in frames)


_PYBT_WAIT = [("/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", 2050, "all_reduce"),
              ("train.py", 50, "step"), ("train.py", 90, "<module>")]
_PYBT_SAVE = [("train.py", 70, "save"), ("train.py", 90, "<module>")]

# stack-dump layouts -> (files, expected culprit): every process but one waits in a collective; the odd one is named
STACK_LAYOUTS: dict[str, tuple[dict[str, str], dict[str, object]]] = {
    # pdsh/clush prefix every line with "host: " (the frame's indentation follows it)
    "pyspy_behind_pdsh": ({"pyspy.txt": "".join(
        "".join(f"gpu-node-{n}: {ln}\n" for ln in _spy(100 + n, _SAVE if n == 7 else _WAIT).splitlines())
        for n in (5, 6, 7, 8))}, {"node": "gpu-node-7"}),
    # pdsh's output piped through dshbak (and clush -b): a '----' / host / '----' block per host
    "pyspy_dshbak_blocks": ({"pyspy.txt": "".join(
        f"----------------\ngpu-node-{n}\n----------------\n" + _spy(4242, _SAVE if n == 7 else _WAIT)
        for n in (5, 6, 7, 8))}, {"node": "gpu-node-7"}),
    # one file per node (srun --output=trace-%N.out) joined by tail/head: "==> trace-gpu-node-7.out <=="
    "pyspy_tail_sections": ({"traces.txt": "".join(
        f"==> trace-gpu-node-{n}.out <==\n" + _spy(4242, _SAVE if n == 7 else _WAIT) + "\n" for n in (5, 6, 7, 8))},
        {"node": "gpu-node-7"}),
    # dumps pasted one after the other with a rank label and no Process header; PyTorch names the main thread
    # "pt_main_thread" (and its autograd threads), so the main thread is the one running the script's <module>
    "pyspy_rank_labels_thread_names": ({"stacks.txt": "".join(
        f"rank {r}:\nThread {2000 + r} (idle): \"pt_autograd_0\"\n    wait (threading.py:320)\n"
        + _spy(1000 + r, _SAVE if r == 2 else _WAIT, name="pt_main_thread", header=False) + "\n" for r in range(4))},
        {"rank": 2}),
    # py-spy before 0.3 (and on macOS): hexadecimal thread ids, no thread name
    "pyspy_hex_tids_no_names": ({"stacks.txt": "".join(
        f"Process {p}: python train.py\nThread 0x7F6D3C29D7{p % 100:02d} (active)\n"
        + "".join(f"    {f}\n" for f in (_SAVE if p == 102 else _WAIT)) + "\n" for p in (100, 101, 102, 103))},
        {"pid": 102}),
    # gdb -p PID -batch -ex py-bt, one after the other
    "gdb_pybt_per_process": ({"gdb.txt": "".join(
        f"Attaching to process {p}\n[Thread debugging using libthread_db enabled]\n"
        + _pybt(_PYBT_SAVE if p == 301 else _PYBT_WAIT) + f"[Inferior 1 (process {p}) detached]\n"
        for p in (300, 301, 302, 303))}, {"pid": 301}),
    # gdb's "thread apply all py-bt" on each rank's process: only the main thread runs <module>
    "gdb_thread_apply_all_pybt": ({f"rank{r}.gdb.txt": (
        f"\nThread 2 (Thread 0x7f00000002 (LWP {500 + r}1) \"pt_autograd_0\"):\n"
        + _pybt([("/usr/lib/python3.10/threading.py", 320, "wait")])
        + f"\nThread 1 (Thread 0x7f00000001 (LWP {500 + r}) \"python\"):\n"
        + _pybt(_PYBT_SAVE if r == 1 else _PYBT_WAIT)) for r in range(4)}, {"rank": 1}),
    # dumps found with grep -r over per-rank files: each line behind "logs/rankN.txt:" (its file's name names the rank)
    "pyspy_behind_grep_H": ({"grep.txt": "".join(
        "".join(f"logs/rank{r}.txt:{ln}\n" for ln in _spy(100 + r, _SAVE if r == 3 else _WAIT).splitlines())
        for r in range(4))}, {"rank": 3}),
    # py-spy in a terminal colours the thread id (console's style(): bold yellow) and a capture keeps the escapes
    "pyspy_ansi_coloured": ({"stacks.txt": "".join(
        f"Process {p}: python train.py\nThread \x1b[1m\x1b[33m{p}\x1b[0m (active): \"MainThread\"\n"
        + "".join(f"    {f}\n" for f in (_SAVE if p == 103 else _WAIT)) + "\n" for p in (100, 101, 102, 103))},
        {"pid": 103}),
}


@pytest.mark.parametrize("layout", sorted(STACK_LAYOUTS))
def test_stack_dumps_in_every_layout_name_the_process_the_others_wait_for(layout: str, tmp_path: Path) -> None:
    files, want = STACK_LAYOUTS[layout]
    v = _triage(files, tmp_path)
    assert v.cls == "hang" and v.first_anomaly is not None and v.first_anomaly.rule == "stack_dump", (
        f"{layout}: {v.cls} {v.reason}")
    got = {k: (v.first_anomaly.pid if k == "pid" else v.culprit.get(k)) for k in want}
    assert got == want, f"{layout}: culprit {v.culprit} pid {v.first_anomaly.pid}, expected {want} ({v.reason})"


def test_the_driver_api_form_of_an_nccl_cuda_failure_is_read_by_its_rule(tmp_path: Path) -> None:
    """CUCHECK's "Cuda failure %d '%s'" (driver API calls, NCCL 2.12+) is the CUDACHECK message with the error number."""
    v = _triage({"a.log": N + "transport/nvls.cc:1 NCCL WARN Cuda failure 801 'operation not supported'\n"}, tmp_path)
    assert (v.cls, v.first_anomaly.rule if v.first_anomaly else None) == ("comm_error", "nccl_cuda_failure"), (
        v.cls, v.reason)


def test_a_tool_s_output_file_name_hints_the_host_it_names_and_no_other() -> None:
    """Slurm's default output 'slurm-%j.out' names a job, not a host; 'srun --output=trace-%N.out' names the node."""
    from titan.triage.lineparse import name_hints

    assert name_hints("slurm-123456.out") == (None, None)
    assert name_hints("trace-jean-zay-iam52.out") == (None, "jean-zay-iam52")
    assert name_hints("logs/gpu47-dmesg.log") == (None, "gpu47")
    assert name_hints("train-rank3.log") == (3, None)
    assert name_hints("trainer-worker-3.log")[1] == "trainer-worker-3"  # a pod's name keeps its words


def test_a_pasted_shell_prompt_names_the_host_of_the_output_under_it(tmp_path: Path) -> None:
    """bash's default prompts (Debian '\\u@\\h:\\w\\$ ', RHEL '[\\u@\\h \\W]\\$ ', a conda env in front): the host of what follows."""
    lost = "Unable to determine the device handle for GPU 0000:1C:00.0: Unknown Error\n"
    for name, prompt, host in (("debian", "(venv) alice@gpu-node-3:~/run$ nvidia-smi\n", "gpu-node-3"),
                               ("rhel", "[alice@dgx12 run]$ nvidia-smi\n", "dgx12"),
                               ("root", "root@hoth:/workspace# nvidia-smi\n", "hoth")):
        v = _triage({"smi.txt": "alice@login1:~$ ssh somewhere\n" + prompt + lost}, tmp_path / name)
        assert (v.cls, v.culprit["node"]) == ("gpu_hardware", host), (name, v.cls, v.culprit, v.reason)
