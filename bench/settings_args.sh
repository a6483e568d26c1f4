# bench/settings_args.sh: sourced (not run) by the benchmark scripts that take
# settings and constants. settings_args NAME ARGS... reads --conf KEY:VALUE,...
# (STOWAGE_CONF's settings) and --tuning KEY:VALUE,... (the pools' measured
# constants, stowage/tuning.h), each as often as given, and exits 2 with NAME's
# usage on anything else. Sets:
#   replay_args  --conf and --tuning as given, for stowage replay and
#                bench/warm_instructions.sh
#   churn_args   one --conf with both, for the C tools (build/vmm_churn,
#                build/planned_steps), whose --conf takes the constants too
settings_args() {
    local name=$1 conf= tuning=
    shift
    while [ $# -gt 0 ]; do
        case "$1" in
        --conf | --tuning)
            [ $# -ge 2 ] || { echo "$name: $1 needs KEY:VALUE,..." >&2; exit 2; }
            if [ "$1" = --conf ]; then conf="${conf:+$conf,}$2"; else tuning="${tuning:+$tuning,}$2"; fi
            shift 2 ;;
        *)
            echo "usage: bench/$name.sh [--conf KEY:VALUE,...] [--tuning KEY:VALUE,...]" >&2
            exit 2 ;;
        esac
    done
    replay_args=(${conf:+--conf "$conf"} ${tuning:+--tuning "$tuning"})
    local both=$conf
    [ -n "$tuning" ] && both="${both:+$both,}$tuning"
    churn_args=(${both:+--conf "$both"})
}
