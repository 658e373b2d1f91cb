#!/usr/bin/env bash
# The fleet status page (`/`, src/cluster/service/status_page.cpp) in a real headless
# browser: a daemon with one cpu pool runs three tiny GPT jobs; Chromium loads the page,
# runs its script, and the DOM it dumps must show
#  - <body data-loaded="true"> (the first render finished),
#  - a row <tr class="job" data-id=ID> for every submitted job,
#  - in each row an <svg class="curve"> with a <polyline> of at least two points;
# and a screenshot of the page is kept as ${LOOM_TEST_ARTIFACTS:-build}/fleet-status-page.png
# (relative to the repository root unless absolute).
# Needs Debian's `chromium`; without it the test fails, or skips (exit 0) when
# LOOM_ALLOW_SKIP=1.
# Usage: test_status_page.sh path/to/loom
set -u
loom=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$here/fleet_lib.sh"
start_s=$(date +%s.%N)
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(date +%s.%N)"; }

chromium=$(command -v chromium || true)
if [[ -z "$chromium" ]]; then
  if [[ "${LOOM_ALLOW_SKIP:-}" == 1 ]]; then
    echo "SKIP: test_status_page: no 'chromium' on PATH (Debian package chromium); LOOM_ALLOW_SKIP=1"
    exit 0
  fi
  echo "FAIL: test_status_page: no 'chromium' on PATH; install Debian's chromium package" \
    "(scripts/install-deps), or set LOOM_ALLOW_SKIP=1 to skip"
  exit 1
fi

dir=$(mktemp -d)
fleet_pid=""
trap '[[ -n "$fleet_pid" ]] && fleet_kill; pkill -KILL -f "$dir/" 2>/dev/null; [[ -n "${KEEP:-}" ]] || rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
finish() {
  if [[ $failures == 0 ]]; then
    echo "PASS: test_status_page ($(elapsed "$start_s") s)"
    exit 0
  fi
  echo "FAIL: test_status_page: $failures failure(s) ($(elapsed "$start_s") s)"
  exit 1
}
cd "$dir"

# --- a daemon and three jobs ---------------------------------------------------------------
cat > pools.yaml <<YAML
pools:
  - {name: cpu, executor: local, backend: cpu, slots: 2, threads: 1, price_per_hour: 1.0}
YAML
fleet_start "$dir/state" pools.yaml || { fail "the daemon did not start"; finish; }
ids=()
for i in 1 2 3; do
  cat > job$i.yaml <<YAML
name: page-$i
steps: 100
config: {layers: 1, width: 32, heads: 2, context: 16, batch: 4, eval_every: 0, final_eval: false, seed: $i, data: $root/data/tinyshakespeare/input.txt}
YAML
  id=$(submit_id job$i.yaml) && [[ -n "$id" ]] || { fail "submit job$i.yaml"; continue; }
  ids+=("$id")
done
[[ ${#ids[@]} == 3 ]] || finish
t=$(date +%s.%N)
wait_all_done 90 || fail "the jobs did not finish in 90 s"
for id in "${ids[@]}"; do
  s=$(job_state "$id")
  [[ $s == succeeded ]] || { fail "job $id: $s"; "$loom" fleet status "$id"; }
done
echo "3 jobs (${ids[*]}) finished in $(elapsed "$t") s"
[[ $failures == 0 ]] || finish

# --- the page in headless Chromium ----------------------------------------------------------
# As root Chromium refuses to start without --no-sandbox. --headless=new is tried first,
# plain --headless second (what it means differs between Chromium versions). HOME and the
# profile live in the temporary folder; stderr (D-Bus noise and all) goes to a log.
mkdir -p "$dir/home"
browse() {  # HEADLESS_FLAG LOG ARGS...: one run of Chromium on a fresh profile, 60 s at most
  local flag=$1 log=$2; shift 2
  rm -rf "$dir/profile"
  HOME="$dir/home" XDG_CONFIG_HOME="$dir/home/.config" XDG_CACHE_HOME="$dir/home/.cache" \
    timeout -k 5 60 "$chromium" "$flag" --no-sandbox --disable-gpu --no-first-run \
    --user-data-dir="$dir/profile" --virtual-time-budget=10000 "$@" 2>> "$log"
}
url="$LOOM_FLEET_SERVER/"
headless=""
version=$("$chromium" --version 2>/dev/null)
for flag in --headless=new --headless; do
  t=$(date +%s.%N)
  : > "$dir/dump.log"
  if browse "$flag" "$dir/dump.log" --dump-dom "$url" > "$dir/dom.html" &&
     grep -q '</html>' "$dir/dom.html"; then
    headless=$flag
    echo "$version, $flag --dump-dom: $(wc -c < "$dir/dom.html") bytes in $(elapsed "$t") s"
    break
  fi
  echo "chromium $flag --dump-dom failed after $(elapsed "$t") s:"
  grep -v -e dbus -e '^$' "$dir/dump.log" | tail -n 5
done
[[ -n "$headless" ]] || { fail "Chromium ($version) did not dump the page"; finish; }

python3 - "$dir/dom.html" "${ids[@]}" <<'PY' || fail "the page's DOM (above)"
import sys
from html.parser import HTMLParser

class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.body = {}
        self.rows = {}      # data-id -> list of polyline point counts inside svg.curve
        self.row = None     # the open tr.job's id
        self.curve = 0      # depth inside svg.curve
        self.in_error = False
        self.error = ""
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "body":
            self.body = a
        elif tag == "div" and a.get("id") == "error":
            self.in_error = True
        elif tag == "tr":
            self.row = a.get("data-id") if "job" in classes else None
            if self.row is not None:
                self.rows.setdefault(self.row, [])
        elif tag == "svg" and "curve" in classes and self.row is not None:
            self.curve += 1
        elif tag == "polyline" and self.curve and self.row is not None:
            self.rows[self.row].append(len((a.get("points") or "").split()))
    def handle_endtag(self, tag):
        if tag == "svg" and self.curve:
            self.curve -= 1
        elif tag == "tr":
            self.row = None
        elif tag == "div":
            self.in_error = False
    def handle_data(self, data):
        if self.in_error:
            self.error += data

path, ids = sys.argv[1], sys.argv[2:]
page = Page()
page.feed(open(path, encoding="utf-8").read())
bad = []
if page.error.strip():
    bad.append(f"the page shows an error: {page.error.strip()}")
if page.body.get("data-loaded") != "true":
    bad.append(f"<body> has data-loaded={page.body.get('data-loaded')!r}, expected 'true' "
               "(the script did not finish a render)")
for id in ids:
    if id not in page.rows:
        bad.append(f"job {id}: no <tr class=\"job\" data-id=\"{id}\"> (rows: {sorted(page.rows)})")
    elif not page.rows[id]:
        bad.append(f"job {id}: no <polyline> inside an <svg class=\"curve\">")
    elif max(page.rows[id]) < 2:
        bad.append(f"job {id}: its curve's polyline has {max(page.rows[id])} point(s), expected >= 2")
for b in bad:
    print("  " + b)
if not bad:
    print("DOM: body loaded; rows " + ", ".join(f"{id} ({max(page.rows[id])} points)" for id in ids))
sys.exit(1 if bad else 0)
PY

# --- a screenshot, kept ---------------------------------------------------------------------
artifacts=${LOOM_TEST_ARTIFACTS:-build}
[[ "$artifacts" == /* ]] || artifacts="$root/$artifacts"
t=$(date +%s.%N)
browse "$headless" "$dir/shot.log" --window-size=1280,900 --screenshot="$dir/page.png" "$url" \
  > /dev/null || true
if python3 - "$dir/page.png" <<'PY'; then
import struct, sys
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
w, h = struct.unpack(">II", data[16:24])
assert (w, h) == (1280, 900), f"{w}x{h}, expected 1280x900"
PY
  echo "screenshot in $(elapsed "$t") s"
  if mkdir -p "$artifacts" && cp "$dir/page.png" "$artifacts/fleet-status-page.png"; then
    echo "screenshot: $artifacts/fleet-status-page.png"
  else
    fail "could not copy the screenshot to $artifacts"
  fi
else
  fail "no 1280x900 PNG screenshot from chromium $headless"
  grep -v -e dbus -e '^$' "$dir/shot.log" | tail -n 5
fi

fleet_stop
fleet_pid=""
finish
