"""The verifier toolchain's commands: shell scripts that answer the published verifier
preamble's downloads without the network (see :mod:`envhub.harbor.toolchain`).

Each script is put in the toolchain's ``shims/`` folder, which is first on ``PATH`` for the
verifier's call only:

- ``curl`` / ``wget``: the uv installer's address (``astral.sh/uv/.../install.sh``) answers
  with an installer that links the toolchain's ``uv`` and ``uvx`` into ``$HOME/.local/bin`` and
  writes its ``env`` file, as the real one does; any other address goes to the image's own
  command (which fails without the network), or fails saying so.
- ``apt-get``: ``update`` is skipped; ``install`` passes when every package is in the image
  already (``curl``, ``wget`` and ``ca-certificates``: the toolchain stands in for them), else
  fails naming the missing ones.
- ``uv`` / ``uvx``: the toolchain's uv, offline, installing from its wheels; a ``-p`` /
  ``--python`` version that the image lacks (none can be downloaded) is replaced by the
  image's Python, said on stderr.
"""

from __future__ import annotations

MOUNT = "/.envhub-verifier"
"""Where the toolchain is mounted (read-only) in a container session."""

_REAL = f"""real() {{
  p=$(printf '%s' "$PATH" | tr ':' '\\n' | grep -v '^{MOUNT}/shims$' | paste -sd: -)
  PATH=$p command -v "$1"
}}
"""

INSTALLER = f"""#!/bin/sh
# envhub's stand-in for the uv installer: links the verifier toolchain's uv (offline).
set -e
dir="${{UV_INSTALL_DIR:-${{XDG_BIN_HOME:-$HOME/.local/bin}}}}"
mkdir -p "$dir"
ln -sf {MOUNT}/shims/uv "$dir/uv"
ln -sf {MOUNT}/shims/uvx "$dir/uvx"
cat > "$dir/env" <<EOF
#!/bin/sh
case ":\\${{PATH}}:" in *:"$dir":*) ;; *) export PATH="$dir:\\$PATH" ;; esac
EOF
cp "$dir/env" "$dir/env.fish" 2>/dev/null || true
echo "envhub: uv installed from the verifier toolchain into $dir (offline)" >&2
"""

FETCH = f"""#!/bin/sh
# envhub verifier toolchain: {{name}} without the network.
{_REAL}for a in "$@"; do
  case "$a" in
    *astral.sh/uv/*install.sh*|*astral.sh/uv/install.sh*)
      cat {MOUNT}/installer.sh; exit 0 ;;
  esac
done
r=$(real {{name}}) && exec "$r" "$@"
echo "envhub: {{name}} $* : {{name}} is not in this image, and the verifier runs without the \\
network (the verifier toolchain answers only the uv installer)" >&2
exit 6
"""

APT_GET = f"""#!/bin/sh
# envhub verifier toolchain: apt-get without the network.
{_REAL}sub=; skip=; pkgs=
for a in "$@"; do
  if [ -n "$skip" ]; then skip=; continue; fi
  case "$a" in
    -o|-c|-t) skip=1 ;;
    -*) ;;
    *) if [ -z "$sub" ]; then sub=$a; else pkgs="$pkgs $a"; fi ;;
  esac
done
case "$sub" in
  update) echo "envhub: apt-get update skipped (the verifier runs without the network)" >&2
          exit 0 ;;
  install) ;;
  *) r=$(real apt-get) && exec "$r" "$@"; exit 100 ;;
esac
missing=
for p in $pkgs; do
  p=${{p%%=*}}; p=${{p%%:*}}
  case "$p" in curl|wget|ca-certificates) continue ;; esac
  dpkg-query -W -f='${{Status}}' "$p" 2>/dev/null | grep -q 'install ok installed' \\
    || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "envhub: apt-get install:$missing not in the image, and the verifier runs without \\
the network: install it in the task's Dockerfile (RUN apt-get install -y$missing)" >&2
  exit 100
fi
echo "envhub: apt-get install:$pkgs already in the image (offline)" >&2
exit 0
"""

UV = f"""#!/bin/sh
# envhub verifier toolchain: uv offline, packages from the toolchain's wheels.
T={MOUNT}
export UV_OFFLINE=1 UV_PYTHON_DOWNLOADS=never UV_FIND_LINKS="$T/wheels"
export UV_CACHE_DIR="${{UV_CACHE_DIR:-/tmp/envhub-uv-cache}}" UV_NO_PROGRESS=1
export UV_LINK_MODE=copy
bin="$T/bin/$(basename "$0")"
n=$#; i=0; next=
while [ $i -lt $n ]; do
  a=$1; shift; i=$((i + 1))
  if [ -n "$next" ]; then next=; a=$(stand_in "$a"); set -- "$@" "$a"; continue; fi
  case "$a" in
    -p|--python) next=1 ;;
    --python=*) a="--python=$(stand_in "${{a#--python=}}")" ;;
  esac
  set -- "$@" "$a"
done
exec "$bin" "$@"
"""

STAND_IN = f"""stand_in() {{
  case "$1" in
    [0-9]*|python[0-9]*|cpython*|">="*) ;;
    *) printf '%s' "$1"; return ;;
  esac
  if {MOUNT}/bin/uv python find "$1" >/dev/null 2>&1; then printf '%s' "$1"; return; fi
  have=$({MOUNT}/bin/uv python find 2>/dev/null) || {{ printf '%s' "$1"; return; }}
  v=$("$have" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  echo "envhub: Python $1 is not in this image and cannot be downloaded (no network at \\
verify time): using its Python $v ($have) instead" >&2
  printf '%s' "$v"
}}
"""


def uv_wrapper() -> str:
    """The ``uv``/``uvx`` script: :data:`UV` with its ``stand_in`` function."""
    head, _, body = UV.partition("bin=")
    return f"{head}{STAND_IN}bin={body}"


def shims() -> dict[str, str]:
    """The toolchain's scripts by path inside it (``shims/NAME``, ``installer.sh``)."""
    uv = uv_wrapper()
    return {
        "installer.sh": INSTALLER,
        "shims/curl": FETCH.replace("{name}", "curl"),
        "shims/wget": FETCH.replace("{name}", "wget"),
        "shims/apt-get": APT_GET,
        "shims/apt": APT_GET,
        "shims/uv": uv,
        "shims/uvx": uv,
    }
