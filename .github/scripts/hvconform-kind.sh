#!/usr/bin/env bash
# The steps of the reusable workflow .github/workflows/hvconform-plugin.yml, one phase a call, so
# the same steps run on a GitHub runner (a stock kindest/node pinned by digest) and here, where
# nothing can be pulled (the offline node image of `nox -s kind-image`, under the kind engine):
#
#   hvconform-kind.sh [--node-image IMG] [--cluster NAME] [--image IMG] [--profile FILE]
#                     [--markers EXPR] [--image-tar FILE] PHASE
#
# Phases, in the workflow's order:
#   node-image  print the kindest/node pinned for KUBERNETES_VERSION (the kind release's digest)
#   install     the suite from its checkout (pip), kind (go install) and the pinned helm (nox)
#   image       the plugin image in the engine: `docker load` of --image-tar when given; a
#               digest-pinned reference absent from the engine is pulled, any other must be there;
#               then the suite's guest image, built from the suite's checkout when absent
#   original    host /dev/kvm snapshot before the cluster exists (kvm-metadata.sh)
#   create      the KIND cluster from the suite's kind/cluster.yaml on --node-image
#   startup     host /dev/kvm at startup: only a GID change to the node's kvm group (kvm-metadata.sh)
#   run         hvconform run --target kind on the existing cluster with the plugin's profile
#   delete      delete the cluster (always)
#   final       host /dev/kvm after the tests and deletion (kvm-metadata.sh; STARTUP_OUTCOME)
#   summary     report.md into $GITHUB_STEP_SUMMARY when the run could not put it there
#   all         every phase above from original on, with the workflow's if: rules (delete, final
#               and summary always; final against the startup outcome): how it runs off a runner
#
# Environment (the flags above override): KIND_NODE_IMAGE, KIND_CLUSTER (hvconform-plugin),
# PLUGIN_IMAGE, PLUGIN_PROFILE, PLUGIN_IMAGE_TAR (or PLUGIN_IMAGE_ARTIFACT: the tars are in
# $RUNNER_TEMP/plugin-image), HVCONFORM_MARKERS, KUBERNETES_VERSION (v1.37),
# HVCONFORM_SUITE (the suite's checkout; default this script's), HVCONFORM_REPORTS (reports),
# KIND_VERSION, HV_METADATA_DIR or RUNNER_TEMP. A refusal is one line on stderr and exit 2.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
suite=${HVCONFORM_SUITE:-$(cd "$here/../.." && pwd)}
cluster=${KIND_CLUSTER:-hvconform-plugin}
node_image=${KIND_NODE_IMAGE:-}
image=${PLUGIN_IMAGE:-}
profile=${PLUGIN_PROFILE:-}
markers=${HVCONFORM_MARKERS:-}
image_tar=${PLUGIN_IMAGE_TAR:-}
# The reusable workflow downloads the caller's artifact (PLUGIN_IMAGE_ARTIFACT) there.
if [[ -z $image_tar && -n ${PLUGIN_IMAGE_ARTIFACT:-} ]]; then
  image_tar=${RUNNER_TEMP:?set RUNNER_TEMP}/plugin-image
fi
reports=${HVCONFORM_REPORTS:-reports}

refuse() {
  echo "hvconform-kind: $*" >&2
  exit 2
}

# The kindest/node image of each Kubernetes minor the suite certifies on a runner: the one the
# pinned kind release (KIND_VERSION, v0.33.0) lists, by its digest. The suite's own KIND target
# builds the same minor offline (hvconform.targets.realnode.KUBERNETES_VERSION).
pinned_node_image() {
  case $1 in
  v1.37 | v1.37.0) echo "kindest/node:v1.37.0@sha256:a1ed56cfb0e7b93589bdf97c8cd566405a265939e3620fc4f5de89adff580ae5" ;;
  *) refuse "no kindest/node pinned for Kubernetes $1 (v1.37 is): pass node-image explicitly" ;;
  esac
}

while (($# > 1)); do
  case $1 in
  --node-image) node_image=$2 ;;
  --cluster) cluster=$2 ;;
  --image) image=$2 ;;
  --profile) profile=$2 ;;
  --markers) markers=$2 ;;
  --image-tar) image_tar=$2 ;;
  *) refuse "unknown option $1 (see the header of $0)" ;;
  esac
  shift 2
done
phase=${1:-}
[[ -n $phase ]] || refuse "no phase (node-image, install, image, original, create, startup, run, delete, final, summary or all)"
# No node image given: the one pinned for KUBERNETES_VERSION (a runner pulls it by digest).
if [[ -z $node_image && $phase =~ ^(create|run|all)$ ]]; then
  node_image=$(pinned_node_image "${KUBERNETES_VERSION:-v1.37}")
fi

# An image is usable when the engine has it; one pinned by digest (a stock kindest/node, a
# registry image) is pulled first when it is not. Anything else is refused, in one line: a tag
# kind would load or the kubelet would pull must already be in the engine.
ensure_image() {
  local what=$1 ref=$2 fix=$3
  [[ -n $ref ]] || refuse "no $what given"
  if docker image inspect "$ref" >/dev/null 2>&1; then
    return 0
  fi
  if [[ $ref == *@sha256:* ]]; then
    docker pull --quiet "$ref" >/dev/null || refuse "$what $ref is not in the engine and could not be pulled"
    return 0
  fi
  refuse "$what $ref is not in the engine (${DOCKER_HOST:-the default docker}): $fix"
}

metadata() {
  KIND_NODE="$cluster-control-plane" bash "$suite/.github/scripts/kvm-metadata.sh" "$1"
}

run_phase() {
  case $1 in
  node-image)
    pinned_node_image "${KUBERNETES_VERSION:-v1.37}"
    ;;
  install)
    python -m pip install --upgrade pip
    python -m pip install nox "${suite}[conformance]"
    go install "sigs.k8s.io/kind@${KIND_VERSION:?set KIND_VERSION}"
    echo "$(go env GOPATH)/bin" >>"${GITHUB_PATH:-/dev/null}"
    # The helm the suite pins (noxfile.py), where hvconform finds it (~/.cache/hv-device-plugin).
    nox -f "$suite/noxfile.py" -s helm
    ;;
  image)
    # --image-tar: a `docker save` file, or a directory of them (a downloaded artifact).
    if [[ -n $image_tar ]]; then
      local tars=("$image_tar")
      if [[ -d $image_tar ]]; then
        tars=("$image_tar"/*.tar)
      fi
      [[ -f ${tars[0]} ]] || refuse "no image tar at $image_tar"
      local tar
      for tar in "${tars[@]}"; do
        docker load --input "$tar"
      done
    fi
    ensure_image "plugin image" "$image" "build it in the calling job (a fixed tag, never :latest)"
    # The suite's workload image (hv-guest:<suite version>): built from the suite's checkout
    # when the engine lacks it (its base, python:3.11-slim, is pinned by digest).
    local guest=${HV_GUEST_IMAGE:-}
    if [[ -z $guest ]]; then
      guest=$(python -c 'from hv_device_plugin.api.names import default_guest_image as g; print(g())')
    fi
    if ! docker image inspect "$guest" >/dev/null 2>&1; then
      docker build --quiet -t "$guest" -f "$suite/images/guest/Dockerfile" "$suite" >/dev/null ||
        refuse "guest image $guest is not in the engine and could not be built from $suite"
    fi
    ;;
  original | startup | final)
    metadata "$1"
    ;;
  create)
    ensure_image "node image" "$node_image" \
      "build it with \`nox -s kind-image\` (hv-kind.local/node), or pass a kindest/node pinned by digest"
    kind create cluster --name "$cluster" --config "$suite/kind/cluster.yaml" \
      --image "$node_image" --wait 120s
    ;;
  run)
    [[ -n $profile ]] || refuse "no plugin profile given"
    [[ -f $profile ]] || refuse "plugin profile $profile does not exist"
    args=(--target kind --existing-cluster --cluster-name "$cluster" --node-image "$node_image"
      --plugin-profile "$profile" --reports-root "$reports")
    if [[ -n $image ]]; then
      args+=(--image "$image")
    fi
    if [[ -n $markers ]]; then
      args+=(-m "$markers")
    fi
    hvconform run "${args[@]}"
    ;;
  delete)
    if command -v kind >/dev/null; then
      kind delete cluster --name "$cluster"
    fi
    ;;
  summary)
    local results=$reports/latest/results.json
    if [[ -f $reports/latest/report.md ]]; then
      echo "hvconform run added $reports/latest/report.md to the job summary"
    elif [[ -f $results ]]; then
      # Exit 1: a check failed or the run was partial, which the run step already reported.
      local code=0
      hvconform report "$results" || code=$?
      if ((code > 1)); then
        return "$code"
      fi
    else
      echo "No conformance results: the run stopped before $results was written." |
        tee -a "${GITHUB_STEP_SUMMARY:-/dev/null}"
    fi
    ;;
  all)
    # The workflow's steps and if: rules, for a machine without a runner: each phase a process
    # of its own, as each step is; what a later phase needs is checked before anything is made.
    ensure_image "node image" "$node_image" \
      "build it with \`nox -s kind-image\` (hv-kind.local/node), or pass a kindest/node pinned by digest"
    [[ -n $profile && -f $profile ]] || refuse "plugin profile ${profile:-(none)} does not exist"
    export KIND_NODE_IMAGE=$node_image KIND_CLUSTER=$cluster PLUGIN_IMAGE=$image \
      PLUGIN_PROFILE=$profile HVCONFORM_MARKERS=$markers PLUGIN_IMAGE_TAR=$image_tar \
      HVCONFORM_SUITE=$suite HVCONFORM_REPORTS=$reports
    export HV_METADATA_DIR=${HV_METADATA_DIR:-${RUNNER_TEMP:-$(mktemp -d /tmp/hvconform-kind.XXXXXX)}/kvm-metadata}
    local failed=0 original=failure startup=skipped
    step() {
      local code=0
      echo "hvconform-kind: $1" >&2
      bash "${BASH_SOURCE[0]}" "$1" || code=$?
      echo "hvconform-kind: $1 exit $code" >&2
      return "$code"
    }
    step image || failed=1
    if ((!failed)); then step original && original=success || failed=1; fi
    if ((!failed)); then step create || failed=1; fi
    if ((!failed)); then step startup && startup=success || startup=failure; fi
    if [[ $startup == failure ]]; then failed=1; fi
    if ((!failed)); then step run || failed=1; fi
    step delete || failed=1
    if [[ $original == success ]]; then STARTUP_OUTCOME=$startup step final || failed=1; fi
    step summary || failed=1
    return "$failed"
    ;;
  *)
    refuse "unknown phase $1 (node-image, install, image, original, create, startup, run, delete, final, summary or all)"
    ;;
  esac
}

run_phase "$phase"
