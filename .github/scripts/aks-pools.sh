#!/usr/bin/env bash
# The AKS workflow's backstop for the temporary node pool (hvconform's own cleanup deletes it;
# this covers a cancelled, timed-out or crashed run).
#   record   before the run: the cluster's node pools
#   cleanup  always, after the run: delete every pool tagged hvconform-run that was not there
#            before, wait for each deletion, then verify that none is left
# Pools that existed before are never touched, even when tagged (another run's, reported).
#
# Environment: AKS_RESOURCE_GROUP, AKS_CLUSTER, HV_POOLS_FILE (default
# $RUNNER_TEMP/aks-pools-before.txt).
set -euo pipefail

action=${1:?usage: aks-pools.sh record|cleanup}
group=${AKS_RESOURCE_GROUP:?set AKS_RESOURCE_GROUP}
cluster=${AKS_CLUSTER:?set AKS_CLUSTER}
before=${HV_POOLS_FILE:-${RUNNER_TEMP:?set HV_POOLS_FILE or RUNNER_TEMP}/aks-pools-before.txt}
tagged='[?tags."hvconform-run"].name'

# Pool names, one a line; no blank line ever stands for a pool.
pools() {
  az aks nodepool list --resource-group "$group" --cluster-name "$cluster" \
    --query "$1" --output tsv | sed '/^[[:space:]]*$/d'
}

# pool_names := the pools tagged hvconform-run. A failed az call fails the step (a process
# substitution would hide the failure and read as "no pools").
tagged_pools() {
  local text
  text=$(pools "$tagged")
  pool_names=()
  if [[ -n $text ]]; then
    mapfile -t pool_names <<<"$text"
  fi
}

case $action in
record)
  pools '[].name' >"$before.tmp"
  mv "$before.tmp" "$before"
  echo "node pools before the run: $(tr '\n' ' ' <"$before")"
  ;;
cleanup)
  if [[ ! -f $before ]]; then
    # The run starts only after the record step succeeded: no record, no pool of this run.
    echo "no record of the pools before the run ($before): the run never started"
    exit 0
  fi
  mapfile -t existing <"$before"
  tagged_pools
  found=("${pool_names[@]}")
  ours=()
  for pool in "${found[@]}"; do
    if [[ " ${existing[*]} " == *" $pool "* ]]; then
      echo "::warning title=AKS node pool::$pool is tagged hvconform-run but existed before this run: left alone"
    else
      ours+=("$pool")
    fi
  done
  for pool in "${ours[@]}"; do
    echo "deleting temporary node pool $pool"
    # A failed deletion does not stop the others; the check below fails the step.
    az aks nodepool delete --resource-group "$group" --cluster-name "$cluster" --name "$pool" ||
      echo "::error title=AKS node pool::deleting $pool failed"
  done
  tagged_pools
  left=("${pool_names[@]}")
  for pool in "${left[@]}"; do
    for gone in "${ours[@]}"; do
      if [[ $pool == "$gone" ]]; then
        echo "::error title=AKS node pool::$pool is still there after its deletion"
        exit 1
      fi
    done
  done
  echo "temporary node pools deleted: ${ours[*]:-none}"
  ;;
*)
  echo "aks-pools.sh: unknown action $action (record or cleanup)" >&2
  exit 2
  ;;
esac
