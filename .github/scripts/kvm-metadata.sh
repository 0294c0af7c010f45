#!/usr/bin/env bash
# One phase of the two-phase host device metadata check, as the KIND workflow runs it.
#   original  before the cluster exists: snapshot the host device
#   startup   once the node is up: the node's kvm group, a snapshot, hvconform's startup check;
#             only an accepted snapshot becomes validated.json
#   final     after the tests and the cluster's deletion: a snapshot compared with validated.json
#             when the startup step succeeded (STARTUP_OUTCOME=success), else with the original
# The rules and verdicts are hvconform's (conformance/metadata/rules.py): exit 0 accepted, 1 rejected,
# 2 unusable input. tests/workflows runs this script, through the workflow, on every fixture.
#
# Environment: HV_METADATA_DIR (default $RUNNER_TEMP/kvm-metadata), HV_DEVICE (/dev/kvm),
# KIND_NODE (startup: the node's container), HV_NODE_KVM_GID (startup: the node's kvm gid, used
# instead of the lookup), STARTUP_OUTCOME (final: steps.<startup id>.outcome),
# GITHUB_STEP_SUMMARY (optional: each verdict is appended).
set -euo pipefail

phase=${1:?usage: kvm-metadata.sh original|startup|final}
dir=${HV_METADATA_DIR:-${RUNNER_TEMP:?set HV_METADATA_DIR or RUNNER_TEMP}/kvm-metadata}
device=${HV_DEVICE:-/dev/kvm}
mkdir -p "$dir"

# Run one hvconform check: print its one-line verdict, annotate a failure, add it to the step
# summary, and return its exit code.
verdict() {
  local out code=0
  out=$("$@" 2>&1) || code=$?
  printf '%s\n' "$out"
  if ((code != 0)); then
    local message=${out//'%'/%25}
    message=${message//$'\r'/%0D}
    echo "::error title=host device metadata::${message//$'\n'/%0A}"
  fi
  if [[ -n ${GITHUB_STEP_SUMMARY:-} ]]; then
    printf -- "- host \`%s\` metadata, %s: %s\n" "$device" "$phase" "$out" >>"$GITHUB_STEP_SUMMARY"
  fi
  return "$code"
}

case $phase in
original)
  # A new run: nothing from an earlier one may stand in for this run's snapshots.
  rm -f "$dir"/{original,startup,validated,final}.json "$dir/lookup.txt"
  hvconform metadata snapshot --device "$device" --out "$dir/original.json"
  cat "$dir/original.json"
  ;;
startup)
  rm -f "$dir"/{startup,validated}.json "$dir/lookup.txt"
  if [[ -n ${HV_NODE_KVM_GID:-} ]]; then
    node=(--node-kvm-gid "$HV_NODE_KVM_GID")
  else
    # A failed lookup leaves no file ("could not be read"), never an empty one to parse.
    if docker exec "${KIND_NODE:?set KIND_NODE}" getent group kvm >"$dir/lookup.tmp"; then
      mv "$dir/lookup.tmp" "$dir/lookup.txt"
    else
      rm -f "$dir/lookup.tmp"
    fi
    node=(--group-lookup "$dir/lookup.txt")
  fi
  hvconform metadata snapshot --device "$device" --out "$dir/startup.json"
  code=0
  verdict hvconform metadata check-startup --original "$dir/original.json" \
    --current "$dir/startup.json" "${node[@]}" || code=$?
  if ((code == 0)); then
    cp "$dir/startup.json" "$dir/validated.json"
  fi
  exit "$code"
  ;;
final)
  rm -f "$dir/final.json"
  hvconform metadata snapshot --device "$device" --out "$dir/final.json"
  reference=(--original "$dir/original.json")
  if [[ ${STARTUP_OUTCOME:-} == success ]]; then
    reference+=(--validated "$dir/validated.json")
  else
    echo "startup validation did not complete (outcome ${STARTUP_OUTCOME:-unknown}):" \
      "comparing with the original snapshot"
  fi
  code=0
  verdict hvconform metadata check-final "${reference[@]}" --current "$dir/final.json" || code=$?
  exit "$code"
  ;;
*)
  echo "kvm-metadata.sh: unknown phase $phase (original, startup or final)" >&2
  exit 2
  ;;
esac
