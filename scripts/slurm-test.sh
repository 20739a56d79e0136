#!/usr/bin/env bash
# The Slurm job-submission hook (deploy/slurm/job_submit.lua) against a real slurmctld and slurmd
# from Debian's packages (Slurm 22.05), started here on this one machine, and a real
# memest-server: jobs are submitted with sbatch and srun, and the hook accepts, refuses, fills in
# and leaves alone as docs/slurm.md says.
#
# Usage: bash scripts/slurm-test.sh   (as root: the daemons run as root; scripts/test.sh calls it)
#        VERBOSE=1 bash scripts/slurm-test.sh   (also what each passing command printed)
#
# No munged, systemd or cgroups: AuthType=auth/none, proctrack/linuxproc, eight fake H100s whose
# device files are links to /dev/null. Everything lives in a temporary directory, removed at the
# end; the daemons are shut down whatever happens. About 30 s.
set -uo pipefail

cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
MEMEST="$(pwd)/${BUILD_DIR}/bin/memest"
SERVER="$(pwd)/${BUILD_DIR}/bin/memest-server"

if [[ "$(id -u)" -ne 0 ]]; then
  echo "slurm-test: SKIPPED: run as root (the daemons run as root)"
  exit 0
fi
for tool in slurmctld slurmd sbatch srun scontrol sinfo; do
  command -v "${tool}" >/dev/null || { echo "slurm-test: ${tool} missing (scripts/install-deps.sh --test)"; exit 1; }
done
[[ -x "${MEMEST}" && -x "${SERVER}" ]] || { echo "slurm-test: build first (scripts/build.sh)"; exit 1; }

BASE="$(mktemp -d /tmp/memest-slurm.XXXXXX)"
export SLURM_CONF="${BASE}/etc/slurm.conf"
server_pid=""
cleanup() {
  scontrol shutdown >/dev/null 2>&1
  for pid in $(cat "${BASE}"/*.pid 2>/dev/null) ${server_pid}; do
    for _ in $(seq 50); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.1; done
    kill -9 "${pid}" 2>/dev/null
  done
  rm -rf "${BASE}"
}
trap cleanup EXIT

free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# memest-server, on a free port.
"${SERVER}" --address 127.0.0.1:0 --log-level warn > "${BASE}/server.out" 2>&1 &
server_pid=$!
address=""
for _ in $(seq 100); do
  address="$(sed -n 's/^memest-server listening on //p' "${BASE}/server.out")"
  [[ -n "${address}" ]] && break
  sleep 0.1
done
[[ -n "${address}" ]] || { echo "slurm-test: memest-server did not start"; cat "${BASE}/server.out"; exit 1; }

# Slurm: one node with eight H100s, the hook beside slurm.conf.
host="$(hostname -s)"
mkdir -p "${BASE}"/{etc,state,spool,log,dev}
for i in 0 1 2 3 4 5 6 7; do ln -s /dev/null "${BASE}/dev/nvidia${i}"; done
cat > "${SLURM_CONF}" <<EOF
ClusterName=memest-test
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
StateSaveLocation=${BASE}/state
SlurmdSpoolDir=${BASE}/spool
SlurmctldPidFile=${BASE}/slurmctld.pidfile
SlurmdPidFile=${BASE}/slurmd.pidfile
SlurmctldLogFile=${BASE}/log/slurmctld.log
SlurmdLogFile=${BASE}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
GresTypes=gpu
JobSubmitPlugins=lua
NodeName=${host} NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=1000 Gres=gpu:h100:8 State=UNKNOWN
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP
EOF
echo "NodeName=${host} Name=gpu Type=h100 File=${BASE}/dev/nvidia[0-7]" > "${BASE}/etc/gres.conf"
cp deploy/slurm/job_submit.lua "${BASE}/etc/job_submit.lua"
cat > "${BASE}/etc/memest_config.lua" <<EOF
return { memest = "${MEMEST}", server = "${address}", timeout_seconds = 20,
         model_dirs = { "$(pwd)/tests/data/hf_configs" } }
EOF

slurmctld -D > "${BASE}/log/slurmctld.out" 2>&1 &
echo $! > "${BASE}/slurmctld.pid"
slurmd -D > "${BASE}/log/slurmd.out" 2>&1 &
echo $! > "${BASE}/slurmd.pid"
state=""
for _ in $(seq 300); do
  state="$(sinfo -h -o %T 2>/dev/null)"
  [[ "${state}" == "idle" ]] && break
  sleep 0.1
done
if [[ "${state}" != "idle" ]]; then
  echo "slurm-test: the node did not come up (state '${state}')"
  tail -20 "${BASE}"/log/*.log
  exit 1
fi

failures=0
# check NAME EXPECTED_EXIT(0|nonzero) PATTERN... -- COMMAND...: runs COMMAND, checks its exit
# status and that its output matches each PATTERN (grep -E); a PATTERN starting with ! must not.
check() {
  local name="$1" want="$2"; shift 2
  local patterns=()
  while [[ "$1" != "--" ]]; do patterns+=("$1"); shift; done
  shift
  local out rc ok=1
  out="$("$@" 2>&1)"; rc=$?
  if [[ "${want}" == 0 && ${rc} -ne 0 ]] || [[ "${want}" != 0 && ${rc} -eq 0 ]]; then ok=0; fi
  for p in "${patterns[@]}"; do
    if [[ "${p}" == !* ]]; then
      grep -qE -- "${p:1}" <<< "${out}" && ok=0
    else
      grep -qE -- "${p}" <<< "${out}" || ok=0
    fi
  done
  if [[ ${ok} -eq 1 ]]; then
    echo "PASS ${name}"
    [[ -n "${VERBOSE:-}" ]] && sed 's/^/    /' <<< "${out}"
  else
    echo "FAIL ${name} (exit ${rc}):"; sed 's/^/    /' <<< "${out}"; failures=$((failures + 1))
  fi
}

LLAMA="memest: --preset llama-7b --seq 2048 --batch 16 --precision bf16"
check "fits its 4 GPUs: accepted, told the split" 0 "memest: fits [0-9]+ x h100-80gb: dp x tp x pp" -- \
  sbatch --test-only --gres=gpu:h100:4 --comment "${LLAMA}" --wrap true
check "1 GPU is too few: refused, told what fits" 1 \
  "does not fit 1 x h100-80gb \(h100\): no split of the model over 1 GPU fits" \
  "the fewest that fit: 2 x h100-80gb" \
  "resubmit with --gres=gpu:h100:2" -- \
  sbatch --test-only --gres=gpu:h100:1 --comment "${LLAMA}" --wrap true
check "srun is checked too" 1 "does not fit 1 x h100-80gb" -- \
  srun --test-only --gres=gpu:h100:1 --comment "${LLAMA}" true
check "--gpus=N is read as well" 0 "memest: fits" -- \
  sbatch --test-only --gpus=h100:2 --comment "${LLAMA}" --wrap true
check "MEMEST_ARGS in a batch job's environment" 1 "does not fit 1 x h100-80gb" -- \
  env MEMEST_ARGS="${LLAMA#memest: }" sbatch --test-only --gres=gpu:h100:1 --wrap true
check "no memest flags: left alone" 0 "!memest" -- \
  sbatch --test-only --gres=gpu:h100:1 --wrap true
check "bad memest flags: refused with memest's message" 1 \
  "the job's memest flags: INVALID_ARGUMENT: config.batch_size: must be positive" -- \
  sbatch --test-only --gres=gpu:h100:1 --comment "memest: --preset llama-7b --batch=-4" --wrap true
check "shell characters: refused" 1 "only letters, digits" -- \
  sbatch --test-only --gres=gpu:h100:1 --comment "memest: --preset llama-7b;touch\${IFS}${BASE}/pwned" --wrap true
[[ -e "${BASE}/pwned" ]] && { echo "FAIL the comment ran a command"; failures=$((failures + 1)); }
check "a model file under model_dirs: read" 1 "does not fit 1 x h100-80gb" -- \
  sbatch --test-only --gres=gpu:h100:1 --comment "memest: --hf-config $(pwd)/tests/data/hf_configs/llama-3-8b.json --seq 4096 --batch 64 --precision bf16" --wrap true
check "any other file: refused" 1 "reads model files only under" -- \
  sbatch --test-only --gres=gpu:h100:1 --comment "memest: --preset llama-7b --lora-config /etc/passwd" --wrap true
check "nor by .. out of model_dirs" 1 "reads model files only under" -- \
  sbatch --test-only --gres=gpu:h100:1 --comment "memest: --hf-config=$(pwd)/tests/data/hf_configs/../../../README.md --seq 8" --wrap true
check "the hook's own flags: refused" 1 "--server is the hook's to set" -- \
  sbatch --test-only --gres=gpu:h100:1 --comment "memest: --preset llama-7b --server 10.0.0.1:1" --wrap true
check "inference: estimated as given" 0 "memest: FITS on h100-80gb" -- \
  sbatch --test-only --gres=gpu:h100:1 --comment "memest: --preset llama-7b --seq 2048 --batch 4 --mode inference --precision bf16-pure" --wrap true

# No GPUs asked for: the fewest that fit are filled in (a held job, to read it back).
out="$(sbatch -H --parsable -o /dev/null --comment "${LLAMA}" --wrap true 2>&1)"
job="$(tail -1 <<< "${out}")"
check "no GPUs asked for: told" 0 "this job now asks for 2 GPUs \(h100\)" -- echo "${out}"
check "no GPUs asked for: the fewest that fit filled in" 0 "TresPerNode=gres:gpu:h100:2" -- \
  scontrol show job "${job}"
scancel "${job}" 2>/dev/null

# A job the hook accepted runs, with its GPUs.
job="$(sbatch --parsable --gres=gpu:h100:2 --comment "${LLAMA}" -o "${BASE}/job.out" \
  --wrap 'echo "gpus=$CUDA_VISIBLE_DEVICES"' 2>/dev/null | tail -1)"
for _ in $(seq 300); do
  scontrol show job -o "${job}" 2>/dev/null | grep -qE "JobState=(COMPLETED|FAILED|CANCELLED)" && break
  sleep 0.1
done
check "an accepted job runs" 0 "JobState=COMPLETED" -- scontrol show job -o "${job}"
check "with the GPUs it asked for" 0 "gpus=0,1" -- cat "${BASE}/job.out"

# memest-server gone: the job is accepted unchecked (fail_open), and says so.
kill "${server_pid}"; wait "${server_pid}" 2>/dev/null; server_pid=""
check "memest unreachable: accepted, not checked" 0 "memest: this job was not checked" -- \
  sbatch --test-only --gres=gpu:h100:1 --comment "${LLAMA}" --wrap true

if [[ ${failures} -ne 0 ]]; then
  echo "slurm-test: ${failures} FAILED; slurmctld's log:"
  grep -i "lua\|memest\|error" "${BASE}/log/slurmctld.log" | tail -20
  exit 1
fi
echo "slurm-test: all passed"
