# out_bundle.sh — sourced by the GPU scripts. The device tool brings back at most 8 files from
# $OUT, so a script that writes many keeps its few key files and tars the rest into one.
# bundle_out DIR NAME KEEP...: every file in DIR but the KEEP names goes into DIR/NAME.tar.gz.
bundle_out() {
  local dir=$1 name=$2
  shift 2
  local keep=" $* " f rest=()
  for f in "$dir"/*; do
    [ -f "$f" ] || continue
    case "$keep" in *" $(basename "$f") "*) ;; *) rest+=("$(basename "$f")") ;; esac
  done
  [ ${#rest[@]} -eq 0 ] && return 0
  tar -czf "$dir/$name.tar.gz.part" -C "$dir" "${rest[@]}" && (cd "$dir" && rm -f "${rest[@]}") &&
    mv "$dir/$name.tar.gz.part" "$dir/$name.tar.gz"
}
