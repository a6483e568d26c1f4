# bench/shared_traces.sh: sourced (not run) by the benchmark scripts. The five
# shared traces they replay, in the order their tables list them, and where
# they are. Needs $root, the repository root. Sets:
#   traces       the trace names (file names without .rep)
#   traces_dir   $STOW_TRACES_DIR, else ../shared/traces beside the repository
#   trace_paths  $traces_dir/NAME.rep for each name, in the same order
traces=(gpt2_train resnet50_train resnet_multiscale_train vit_train gpt2_generate)
traces_dir=${STOW_TRACES_DIR:-$root/../shared/traces}
trace_paths=()
for t in "${traces[@]}"; do trace_paths+=("$traces_dir/$t.rep"); done
