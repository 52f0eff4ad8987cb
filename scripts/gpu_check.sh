#!/usr/bin/env bash
# The CUDA path of rlvr on a bare, offline GPU machine that has torch, transformers, peft and
# accelerate but neither vLLM nor rlvr's other dependencies: rlvr runs from this checkout with the
# transformers rollout backend, and the few pure-Python packages it still needs come in .gpu_site/.
#
#   bash scripts/gpu_check.sh --prepare      # here, once: copy those packages from .venv into .gpu_site/
#   bash scripts/gpu_check.sh [args]         # there: scripts/gpu_check.py [args] (--device cpu to try it here)
#   bash scripts/gpu_check.sh --tests        # there: the tests marked gpu (tests/test_gpu.py)
#
# With the device tool: run(command="bash scripts/gpu_check.sh", carry=[".gpu_site"]). It prints one
# table (see scripts/gpu_check.py); all of its cases took 5 minutes on one H200 (2026-12-04).
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=.gpu_site
# rlvr's imports at run time that such a machine lacks: Hydra and OmegaConf (antlr4 is OmegaConf's
# parser), rich (with markdown-it, mdurl, pygments); pytest (with pluggy, iniconfig) for --tests.
PACKAGES="hydra omegaconf antlr4 rich markdown_it mdurl pygments pytest _pytest pluggy iniconfig"

if [ "${1:-}" = "--prepare" ]; then
    src=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    rm -rf "$SITE" && mkdir -p "$SITE"
    for p in $PACKAGES; do cp -r "$src/$p" "$SITE/"; done
    find "$SITE" -name __pycache__ -prune -exec rm -rf {} +
    echo "$SITE: $(du -sh "$SITE" | cut -f1) ($PACKAGES)"
    exit 0
fi

PY=${PYTHON:-python3}
[ -d "$SITE" ] || { echo "gpu_check: $SITE/ is missing: run 'bash scripts/gpu_check.sh --prepare' where .venv is, and carry it" >&2; exit 1; }
export PYTHONPATH="$PWD:$PWD/$SITE${PYTHONPATH:+:$PYTHONPATH}"
export RLVR_CACHE=${RLVR_CACHE:-$PWD/.cache/rlvr}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$PY" -c "import torch, transformers, peft; print('torch', torch.__version__, '| transformers', transformers.__version__, '| peft', peft.__version__, '| cuda', torch.cuda.is_available())"
if [ "${1:-}" = "--tests" ]; then exec "$PY" -m pytest -p no:cacheprovider tests/test_gpu.py; fi
exec "$PY" scripts/gpu_check.py "$@"
