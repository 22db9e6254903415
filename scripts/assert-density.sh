#!/usr/bin/env bash
# Assertion density of the library code (issue 52, "Invariants in every
# build"): assertions per 1,000 lines of crates/*/src/**/*.rs, per crate and
# in total. Lines counted: not blank, not comment-only, not inside a
# `#[cfg(test)]` item (an inline `mod tests { }`, a test-only function) nor in
# a file that is a `#[cfg(test)] mod x;`. Assertions counted: assert!,
# assert_eq!, assert_ne!, debug_assert*! (so `const _: () = assert!(..)` too)
# and the invariant helpers' uses (`invariant!`, `meta_invariant!`, ...).
# vendor/ is not under crates/ and is not counted.
#
# Usage: scripts/assert-density.sh [THRESHOLD]   (default 5.0)
# Exits 1 when the total is under THRESHOLD.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "${1:-5.0}" <<'PY'
import glob, os, re, sys

threshold = float(sys.argv[1])
ASSERT = re.compile(r'(?<![A-Za-z0-9_])(?:debug_)?assert(?:_eq|_ne)?!|(?<![A-Za-z0-9_])[a-z_]*invariant!')


def strip(src):
    """The source with comments and the contents of string and char
    literals blanked (newlines kept), so braces and macro names are only
    code's."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
            i = j
        elif src.startswith('/*', i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith('/*', j):
                    depth, j = depth + 1, j + 2
                elif src.startswith('*/', j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(''.join(ch if ch == '\n' else ' ' for ch in src[i:j]))
            i = j
        elif re.match(r'b?r#*"', src[i:i + 40]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == '_')):
            m = re.match(r'b?r(#*)"', src[i:])
            close = '"' + m.group(1)
            j = src.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            out.append('"' + ''.join(ch if ch == '\n' else ' ' for ch in src[i + 1:j - 1]) + '"')
            i = j
        elif c == '"' or (c == 'b' and src.startswith('b"', i) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == '_'))):
            j = i + (2 if c == 'b' else 1)
            while j < n and src[j] != '"':
                j += 2 if src[j] == '\\' else 1
            j += 1
            out.append('"' + ''.join(ch if ch == '\n' else ' ' for ch in src[i + 1:j - 1]) + '"')
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", src[i:])
            if m:
                out.append("' '")
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return ''.join(out)


CFG_TEST = re.compile(r'#\[cfg\(test\)\]')


def test_spans(code):
    """Character spans of items under #[cfg(test)], and the names of
    `#[cfg(test)] mod x;` declarations."""
    spans, mods = [], []
    for m in CFG_TEST.finditer(code):
        j = m.end()
        # The item: up to its first `;` (a declaration) or its braces.
        k = j
        while k < len(code) and code[k] not in '{;':
            k += 1
        if k >= len(code):
            continue
        if code[k] == ';':
            d = re.search(r'\bmod\s+([A-Za-z0-9_]+)\s*;', code[j:k + 1])
            if d:
                mods.append(d.group(1))
            spans.append((m.start(), k + 1))
            continue
        depth, e = 0, k
        while e < len(code):
            if code[e] == '{':
                depth += 1
            elif code[e] == '}':
                depth -= 1
                if depth == 0:
                    break
            e += 1
        spans.append((m.start(), e + 1))
    return spans, mods


files = sorted(glob.glob('crates/*/src/**/*.rs', recursive=True))
stripped = {}
excluded = set()
for f in files:
    code = strip(open(f, encoding='utf-8').read())
    spans, mods = test_spans(code)
    stripped[f] = (code, spans)
    base = f[:-3] if not f.endswith(('/mod.rs', '/lib.rs', '/main.rs')) else os.path.dirname(f)
    for name in mods:
        excluded.add(os.path.join(base, name + '.rs'))
        excluded.add(os.path.join(base, name, 'mod.rs'))


def in_test_module(f):
    """A file under a directory that is a test-only module."""
    d = f
    while d.count('/') > 2:
        d = os.path.dirname(d)
        if d + '.rs' in excluded or os.path.join(d, 'mod.rs') in excluded:
            return True
    return False


per = {}
for f in files:
    if f in excluded or in_test_module(f):
        continue
    code, spans = stripped[f]
    keep = list(code)
    for a, b in spans:
        for p in range(a, b):
            if keep[p] != '\n':
                keep[p] = ' '
    text = ''.join(keep)
    lines = sum(1 for ln in text.split('\n') if ln.strip())
    asserts = len(ASSERT.findall(text))
    crate = f.split('/')[1]
    l0, a0 = per.get(crate, (0, 0))
    per[crate] = (l0 + lines, a0 + asserts)

tl = sum(v[0] for v in per.values())
ta = sum(v[1] for v in per.values())
print(f"{'crate':<10} {'lines':>7} {'asserts':>8} {'per 1000':>9}")
for crate in sorted(per):
    l, a = per[crate]
    print(f"{crate:<10} {l:>7} {a:>8} {1000 * a / max(l, 1):>9.2f}")
density = 1000 * ta / max(tl, 1)
print(f"{'total':<10} {tl:>7} {ta:>8} {density:>9.2f}")
if density < threshold:
    print(f"assertion density {density:.2f} is under {threshold}", file=sys.stderr)
    sys.exit(1)
PY
