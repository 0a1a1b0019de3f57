#!/usr/bin/env bash
# Builds glasspipe's two container images from operator/Dockerfile and sparkapp/Dockerfile with
# Debian's podman: no Docker engine, no daemon, no image registry.
#   docker.io/glasspipe/operator:0.1.0   $GLASSPIPE_CACHE/images/glasspipe-operator.oci.tar
#   docker.io/glasspipe/spark:0.1.0      $GLASSPIPE_CACHE/images/glasspipe-spark.oci.tar
# The Dockerfiles start FROM docker.io/library/debian:bookworm-slim; no registry is reachable here,
# so that base is made from Debian's packages with mmdebstrap and imported under the same name (on a
# normal machine the same Dockerfiles pull the public image). Storage, runtime and limits are those of
# dev/images/podman.sh (docs/images.md says why). Cached: the base once; each image is rebuilt only
# when its inputs change (hash of its Dockerfile, build context files and base image), else skipped.
source "$(dirname "$0")/../lib.sh"

VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$GP_ROOT/pyproject.toml")"
BASE_REF=docker.io/library/debian:bookworm-slim
IMAGES_DIR="$GLASSPIPE_CACHE/images"
CONTEXT="$IMAGES_DIR/context"
PODMAN=(bash "$GP_ROOT/dev/images/podman.sh")
# Bump when the way images are built changes, so that cached builds are redone.
RECIPE="images recipe 1"
mkdir -p "$IMAGES_DIR"
exec 9>"$IMAGES_DIR/.lock"
flock 9

# --- tools ------------------------------------------------------------------------------------------
missing=()
command -v podman >/dev/null || missing+=(podman)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v runc >/dev/null || missing+=(runc)
command -v newuidmap >/dev/null || missing+=(uidmap)
if [ ${#missing[@]} -gt 0 ]; then
  gp_log "images: installing ${missing[*]} from Debian"
  if ! apt-get install -y -o DPkg::Lock::Timeout=900 "${missing[@]}"; then
    apt-get update -o DPkg::Lock::Timeout=900
    apt-get install -y -o DPkg::Lock::Timeout=900 "${missing[@]}"
  fi
fi

# --- base image -------------------------------------------------------------------------------------
# Like Docker's debian:bookworm-slim (debuerreotype): minbase, merged /usr set up the debootstrap way
# (mmdebstrap's default installs usrmerge, which leaves 70 MB of Perl behind), the same apt sources,
# no man pages, docs or locales. Remade when this recipe changes (a label on the image).
BASE_RECIPE="minbase bookworm merged-usr-hook slim-excludes 1"
base_label() {
  "${PODMAN[@]}" image inspect --format '{{index .Labels "io.glasspipe.base-recipe"}}' "$BASE_REF" 2>/dev/null || true
}
if [ "$(base_label)" != "$BASE_RECIPE" ]; then
  gp_log "images: making $BASE_REF from Debian's packages (mmdebstrap --variant=minbase bookworm)"
  started=$(date +%s)
  work="$(mktemp -d "$IMAGES_DIR/base.tmp.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  mmdebstrap --variant=minbase --quiet --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    bookworm "$work/base.tar" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main"
  "${PODMAN[@]}" import --quiet --change 'CMD ["bash"]' --change "LABEL io.glasspipe.base-recipe=\"$BASE_RECIPE\"" \
    --message "mmdebstrap --variant=minbase bookworm (glasspipe dev/install/images.sh)" \
    "$work/base.tar" "$BASE_REF" >/dev/null
  rm -rf "$work"
  trap - EXIT
  gp_log "images: base $BASE_REF made in $(( $(date +%s) - started )) s"
fi
BASE_ID="$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$BASE_REF")"

# --- leftovers of killed builds -----------------------------------------------------------------------
# A build killed mid-way (a CI run stopped during its set-up) leaves its working container in the storage
# (`ps --external`, status "Storage"). It holds the build's intermediate image, so `image prune` below would
# refuse with "image is in use by a container" and fail the set-up. Under the lock above no build of ours is
# running, so every such container is a leftover.
leftovers="$("${PODMAN[@]}" ps --all --external --format '{{.ID}} {{.Status}}' | awk '$2 == "Storage" {print $1}')"
if [ -n "$leftovers" ]; then
  gp_log "images: removing $(wc -w <<<"$leftovers") working container(s) of killed builds"
  # shellcheck disable=SC2086
  "${PODMAN[@]}" rm --force --storage $leftovers >/dev/null
fi

# --- build context ----------------------------------------------------------------------------------
# Only what the Dockerfiles copy, plus the jars from the cache (dev/images/stage-jars.sh).
rm -rf "$CONTEXT"
mkdir -p "$CONTEXT"
(cd "$GP_ROOT" && tar -c --exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' \
  pyproject.toml README.md operator sparkapp/Dockerfile sparkapp/glasspipe_job examples \
  dev/images/spark-entrypoint.sh dev/images/dump-driver-cds.sh) | tar -x -C "$CONTEXT"
bash "$GP_ROOT/dev/images/stage-jars.sh" "$CONTEXT"
# The class list the Spark image dumps its driver archive from (a real local run: cached after the first).
bash "$GP_ROOT/dev/install/spark-cds.sh" >/dev/null
mkdir -p "$CONTEXT/build/spark-cds"
cp "$(PYTHONPATH="$GP_ROOT/operator:$GP_ROOT/sparkapp:$GP_ROOT/dev" "$GP_VENV/bin/python" -m glasspipe_dev.spark_cds \
  --class-list)" "$CONTEXT/build/spark-cds/driver.classlist"

inputs_hash() {  # inputs_hash PATH... : one digest of the recipe, the base and these context files
  { echo "$RECIPE"; echo "base $BASE_ID"
    (cd "$CONTEXT" && find "$@" -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
  } | sha256sum | cut -c1-64
}

CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
BUILT=0
build() {  # build NAME REF DOCKERFILE INPUT...
  local name="$1" ref="$2" dockerfile="$3"
  shift 3
  local archive="$IMAGES_DIR/$name.oci.tar" stamp="$IMAGES_DIR/$name.inputs" hash started
  hash="$(inputs_hash "$dockerfile" "$@")"
  if [ -f "$archive" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$hash" ] && "${PODMAN[@]}" image exists "$ref"; then
    gp_log "images: $ref cached ($archive)"
    return
  fi
  gp_log "images: building $ref from $dockerfile"
  started=$(date +%s)
  local secret=()
  # PyPI behind a TLS-inspecting proxy: the host's CA bundle, as a build secret (not in any layer).
  if [ -s "$CA_BUNDLE" ]; then secret=(--secret "id=pip-ca,src=$CA_BUNDLE"); fi
  "${PODMAN[@]}" build --isolation chroot --network host --pull=never --layers \
    "${secret[@]}" -f "$CONTEXT/$dockerfile" -t "$ref" "$CONTEXT"
  gp_log "images: built $ref in $(( $(date +%s) - started )) s; saving $archive"
  rm -f "$archive" "$stamp"
  "${PODMAN[@]}" save --quiet --format oci-archive -o "$archive.tmp" "$ref"
  mv "$archive.tmp" "$archive"
  echo "$hash" >"$stamp"
  BUILT=1
  gp_log "images: $ref done in $(( $(date +%s) - started )) s," \
    "$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$ref" | awk '{printf "%d MB", $1 / 1e6}')"
}

build glasspipe-operator "docker.io/glasspipe/operator:$VERSION" operator/Dockerfile \
  pyproject.toml README.md operator sparkapp/glasspipe_job examples
build glasspipe-spark "docker.io/glasspipe/spark:$VERSION" sparkapp/Dockerfile \
  pyproject.toml README.md operator sparkapp/glasspipe_job dev/images/spark-entrypoint.sh build/spark-jars \
  dev/images/dump-driver-cds.sh build/spark-cds
if [ "$BUILT" = 1 ]; then
  # The images these builds replaced (now untagged) and their layers; the current images' build
  # cache (their parent layers) stays.
  "${PODMAN[@]}" image prune --force >/dev/null
fi
echo "images ok: docker.io/glasspipe/operator:$VERSION docker.io/glasspipe/spark:$VERSION in $IMAGES_DIR"
