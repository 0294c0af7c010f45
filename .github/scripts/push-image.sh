#!/usr/bin/env bash
# Push the plugin image ($PLUGIN_TAG, already built and logged in) and hand the next steps the
# reference by digest as the step output `image` (REGISTRY/REPOSITORY@sha256:...): the cluster
# runs exactly what was pushed, whatever happens to the tag later.
set -euo pipefail

: "${PLUGIN_TAG:?PLUGIN_TAG (the image to push) is not set}"
: "${GITHUB_OUTPUT:?GITHUB_OUTPUT is not set (a GitHub Actions step)}"
docker push "$PLUGIN_TAG"
# The repository is the tag without its last ":tag" (a registry host may carry a port).
repository=${PLUGIN_TAG%:*}
ref=""
while read -r candidate; do
  if [[ $candidate == "$repository@"* ]]; then
    ref=$candidate
  fi
done < <(docker inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$PLUGIN_TAG")
if ! [[ $ref =~ ^[^@]+@sha256:[0-9a-f]{64}$ ]]; then
  echo "::error title=push::no sha256 digest of $repository after pushing $PLUGIN_TAG" >&2
  exit 1
fi
echo "image=$ref" >>"$GITHUB_OUTPUT"
echo "pushed $PLUGIN_TAG as $ref"
