# Sourced before bench/bench_live.py on a machine without nvidia-modelopt (the device image): puts a stand-in
# `modelopt.torch.opt.dynamic` (an empty DynamicModule class) on PYTHONPATH, so megatron-bridge's
# is_modelopt_dynamic_module answers False at once, as with modelopt installed, instead of retrying a failing import on
# every AutoMapping call, which inflates the export a live ratio divides by (docs/live.md#cost). Bench use only.
if ! python3 -c "import modelopt.torch.opt.dynamic" 2>/dev/null; then
  stub=${TMPDIR:-/tmp}/modelopt-standin
  mkdir -p "$stub/modelopt/torch/opt"
  touch "$stub/modelopt/__init__.py" "$stub/modelopt/torch/__init__.py" "$stub/modelopt/torch/opt/__init__.py"
  printf 'class DynamicModule:  # stand-in: no module is one, as with modelopt installed\n    pass\n' \
    > "$stub/modelopt/torch/opt/dynamic.py"
  export PYTHONPATH="$stub${PYTHONPATH:+:$PYTHONPATH}"
fi
