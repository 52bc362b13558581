#!/usr/bin/env bash
# GPU checks for a machine with NVIDIA GPUs, run from the repository root:
#     bash scripts/gpu-check.sh
# Prints one "PASS|FAIL|SKIP <check>: <detail>" line per check and exits 1 if any FAILed.
# Bounded to ~5 minutes in all (each check runs under `timeout`). Needs no network when
# .venv exists or the system python has torch / nvidia-ml-py; otherwise it tries to build
# .venv-gpu with pip (which needs a package index).
#
# Checks (append new ones as check_<name> functions and list them in CHECKS below):
#   nvml  - titan.monitor.gpu over the real NVML: every GPU's temperature, power, memory,
#           ECC, row remapping, throttle reasons, NVLink, and the Xid event set registered.
#   xid   - the kernel-log watcher reads the live /dev/kmsg (or journalctl) end to end
#           (a harmless marker line is written when /dev/kmsg is writable) and classifies
#           NVRM Xid lines; it never writes a fake Xid into the kernel log unless
#           TITAN_GPU_CHECK_INJECT_XID=1.
#   rng_ckpt   - titan.checkpoint round trip of every CUDA device's RNG (and a dropout mask).
#   guard_nccl - guarded DDP (tinygpt) on NCCL, one rank per GPU: forward/backward/comm hooks
#                under torch.cuda.set_sync_debug_mode("error"); host syncs per step counted
#                under "warn"; a NaN injected on rank 0 is skipped on every rank.
#   nccl_heal  - the NCCL primitives of in-place healing (issue 23; gloo + warm group restart is
#                the tested default): a subgroup's ProcessGroup.abort() leaves the world group
#                working; shrink_group(SHRINK_ABORT) around a rank that never joins a pending
#                all-reduce, then an all-reduce on the shrunk group (needs >= 2 GPUs and an NCCL
#                with ncclCommShrink, else SKIP with the reason); revoke/reconfigure: SKIP when
#                the installed torch has no such API (torch 2.13 has neither).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
FAILS=0

say() { echo "$1 $2"; [ "${1%% *}" = FAIL ] && FAILS=$((FAILS + 1)); return 0; }

pick_python() {
  if [ -x .venv/bin/python ] && .venv/bin/python -c "import pynvml" 2>/dev/null; then
    PY=.venv/bin/python; return
  fi
  for cand in .venv/bin/python .venv-gpu/bin/python python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import pynvml" 2>/dev/null; then PY=$cand; return; fi
  done
  # Build a venv that sees the system packages (torch may be there already).
  if [ ! -x .venv-gpu/bin/python ]; then
    python3 -m venv --system-site-packages .venv-gpu >/dev/null 2>&1 || true
  fi
  if [ -x .venv-gpu/bin/python ]; then
    export PIP_DEFAULT_TIMEOUT=15 PIP_RETRIES=1 PIP_DISABLE_PIP_VERSION_CHECK=1
    timeout 240 .venv-gpu/bin/pip install -q nvidia-ml-py psutil rich >/dev/null 2>&1 || true
    if ! .venv-gpu/bin/python -c "import torch" 2>/dev/null; then
      timeout 240 .venv-gpu/bin/pip install -q torch numpy >/dev/null 2>&1 || true
    fi
    PY=.venv-gpu/bin/python; return
  fi
  PY=python3
}

pick_python
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
echo "gpu-check: python $PY ($($PY -c 'import sys; print(sys.version.split()[0])' 2>/dev/null)), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo 'nvidia-smi absent')"

check_nvml() {
  local out
  out=$(timeout 60 "$PY" - <<'EOF' 2>&1
import json, sys, time
try:
    import pynvml  # noqa: F401
except ImportError:
    print("SKIP nvml: nvidia-ml-py is not importable (pip install nvidia-ml-py)"); sys.exit(0)
from titan.monitor.gpu import GpuCollector
from titan.monitor.base import parse_key
col = GpuCollector(state_file="/tmp/titan-gpu-check-ecc.json")
r = col.collect(time.time()); time.sleep(0.5); r = col.collect(time.time())
if not r.ok:
    print(f"FAIL nvml: {r.status}"); sys.exit(0)
gpus = {}
for k, v in r.metrics.items():
    name, lab = parse_key(k)
    gpus.setdefault(lab.get("gpu"), {})[name if len(lab) == 1 else k] = v
need = ("gpu_temperature_celsius", "gpu_power_watts", "gpu_memory_used_bytes", "gpu_utilization_ratio")
bad = [(g, n) for g, m in gpus.items() for n in need if n not in m]
head = f"nvml: {len(gpus)} GPU(s) {r.info.get('gpus')}, driver {r.info.get('driver')}"
print(f"FAIL {head}; missing fields {bad}" if bad or not gpus else f"PASS {head}")
for g, m in sorted(gpus.items()):
    ecc = {k.split('type="')[1].split('"')[0]: v for k, v in m.items() if "ecc_errors_total" in k and 'counter="volatile"' in k}
    thr = [k.split('reason="')[1].split('"')[0] for k, v in m.items() if "clock_throttled" in k and v]
    print(f"  gpu{g}: {m.get('gpu_temperature_celsius')} C, {m.get('gpu_power_watts')} W, "
          f"util {m.get('gpu_utilization_ratio')}, ECC volatile {ecc}, remap pending/failure "
          f"{m.get('gpu_row_remap_pending')}/{m.get('gpu_row_remap_failure')}, "
          f"nvlinks {m.get('gpu_nvlink_active_links')}, throttled {thr or 'no'}")
xe = r.info.get("xid_events", "")
ok = xe.startswith("registered on") and xe.split()[2].split("/")[0] == xe.split()[2].split("/")[1]
print(f"{'PASS' if ok else 'FAIL'} nvml-xid-events: {xe}")
print(f"INFO dcgm: {r.info.get('dcgm')}; unsupported fields: {r.info.get('unsupported', [])}")
col.close()
EOF
  )
  [ $? -eq 124 ] && out="FAIL nvml: timed out after 60 s"
  while IFS= read -r line; do
    case "$line" in PASS*|FAIL*|SKIP*) say "${line%% *}" "${line#* }";; *) echo "$line";; esac
  done <<< "$out"
}

check_xid() {
  local out
  out=$(TITAN_GPU_CHECK_INJECT_XID="${TITAN_GPU_CHECK_INJECT_XID:-0}" timeout 60 "$PY" - <<'EOF' 2>&1
import os, sys, time, uuid
from titan.monitor.kmsg import KmsgCollector, classify_line
line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
f = classify_line(line)
ok = f is not None and f.data["code"] == 79 and f.data["action"] == "exclude_node"
print(f"{'PASS' if ok else 'FAIL'} xid-classify: Xid 79 -> {f.data.get('action') if f else None}")
col = KmsgCollector()
if not col.source:
    print(f"SKIP xid-watch: {col.collect(0).status}"); sys.exit(0)
marker = f"titan-gpu-check marker {uuid.uuid4().hex[:8]}"
inject = os.environ.get("TITAN_GPU_CHECK_INJECT_XID") == "1"
try:
    with open("/dev/kmsg", "w") as k:
        k.write(marker + "\n")
        if inject:
            k.write("NVRM: Xid (PCI:0000:00:00): 999, titan gpu-check synthetic Xid (ignore)\n")
except OSError as e:
    print(f"SKIP xid-watch: reading {col.source} works but /dev/kmsg is not writable for a marker ({e.strerror})")
    col.close(); sys.exit(0)
seen, findings = False, []
deadline = time.time() + 10
while time.time() < deadline and not (seen and (findings or not inject)):
    for ln in col.read_new_lines():
        seen |= marker in ln
        g = classify_line(ln)
        if g is not None and g.category == "xid" and g.data["code"] == 999:
            findings.append(g)
    time.sleep(0.2)
col.close()
print(f"{'PASS' if seen else 'FAIL'} xid-watch: marker line {'read back' if seen else 'NOT seen'} from {col.source}")
if inject:
    print(f"{'PASS' if findings else 'FAIL'} xid-watch-inject: synthetic Xid 999 {'classified' if findings else 'missed'}")
EOF
  )
  [ $? -eq 124 ] && out="FAIL xid: timed out after 60 s"
  while IFS= read -r line; do
    case "$line" in PASS*|FAIL*|SKIP*) say "${line%% *}" "${line#* }";; *) echo "$line";; esac
  done <<< "$out"
}

check_rng_ckpt() {
  local out
  out=$(timeout 90 "$PY" scripts/gpu_checks.py rng-ckpt 2>&1)
  [ $? -eq 124 ] && out="FAIL rng-ckpt: timed out after 90 s"
  while IFS= read -r line; do
    case "$line" in PASS*|FAIL*|SKIP*) say "${line%% *}" "${line#* }";; *) echo "  $line";; esac
  done <<< "$(echo "$out" | grep -E '^(PASS|FAIL|SKIP)' || echo "FAIL rng-ckpt: no verdict; $(echo "$out" | tail -3 | tr '\n' ' ')")"
}

check_guard_nccl() {
  local out n
  n=$(( NGPU > 0 ? NGPU : 1 ))
  out=$(timeout 150 "$PY" -m torch.distributed.run --standalone --nproc-per-node "$n" scripts/gpu_checks.py guard-nccl 2>&1)
  [ $? -eq 124 ] && out="FAIL guard-nccl: timed out after 150 s"
  while IFS= read -r line; do
    case "$line" in PASS*|FAIL*|SKIP*) say "${line%% *}" "${line#* }";; *) echo "  $line";; esac
  done <<< "$(echo "$out" | grep -E '^(PASS|FAIL|SKIP)' || echo "FAIL guard-nccl: no verdict; $(echo "$out" | tail -3 | tr '\n' ' ')")"
}

check_nccl_heal() {
  local out n
  if [ "$NGPU" -lt 1 ]; then
    say SKIP "nccl-heal: no CUDA device (torch.cuda.device_count() = 0); shrink_group/abort need NCCL on GPUs"
    return
  fi
  out=$(timeout 90 "$PY" -m torch.distributed.run --standalone --nproc-per-node "$NGPU" scripts/gpu_checks.py nccl-heal 2>&1)
  [ $? -eq 124 ] && out="FAIL nccl-heal: timed out after 90 s; $(echo "$out" | grep -E '^(PASS|FAIL|SKIP|INFO)' | tr '\n' ' ')"
  while IFS= read -r line; do
    case "$line" in PASS*|FAIL*|SKIP*) say "${line%% *}" "${line#* }";; *) echo "  $line";; esac
  done <<< "$(echo "$out" | grep -E '^(PASS|FAIL|SKIP|INFO)' || echo "FAIL nccl-heal: no verdict; $(echo "$out" | tail -3 | tr '\n' ' ')")"
}

NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
case "$NGPU" in ''|*[!0-9]*) NGPU=0;; esac
CHECKS=(nvml xid rng_ckpt guard_nccl nccl_heal)
for c in "${CHECKS[@]}"; do
  if [ $(( $(date +%s) - START )) -gt 280 ]; then say "FAIL" "$c: not run, the 5-minute budget is spent"; continue; fi
  "check_$c"
done
echo "gpu-check: $FAILS failure(s) in $(( $(date +%s) - START )) s"
[ "$FAILS" -eq 0 ]
