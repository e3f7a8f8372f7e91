"""Target patterns of mutants sharing a launch: could two fnmatch patterns ever name the same finding?"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache, lru_cache

from convcheck.mutants.catalog import FORWARD


def targets_meet(a: Sequence[str], b: Sequence[str], forward: bool = True) -> bool:
    """Could one finding be claimed by both target lists? (`logits` only counts when the logits oracle runs;
    a target `*` claims everything, `logits` included.)"""
    for pa in a:
        for pb in b:
            if FORWARD in (pa, pb):
                if forward and {pa, pb} <= {FORWARD, "*"}:
                    return True
            elif globs_meet(pa, pb):
                return True
    return False


@lru_cache(maxsize=4096)
def globs_meet(a: str, b: str) -> bool:
    """Whether two target patterns can name one tensor, reading a `*` before the end of a pattern as one name
    component (no dot): "*.layers.0.*" and "*.layers.1.*" are apart. Planning only: attribution itself uses
    fnmatch, and a finding both mutants claim sends them to run alone."""
    ta, tb = _tokens(a), _tokens(b)

    @cache
    def meet(i: int, j: int) -> bool:
        if i == len(ta) and j == len(tb):
            return True
        star_a = i < len(ta) and ta[i] in _STARS
        if star_a and (meet(i + 1, j) or (j < len(tb) and _absorbs(ta[i], tb[j]) and meet(i, j + 1))):
            return True
        star_b = j < len(tb) and tb[j] in _STARS
        if star_b and (meet(i, j + 1) or (i < len(ta) and _absorbs(tb[j], ta[i]) and meet(i + 1, j))):
            return True
        if i < len(ta) and j < len(tb) and ta[i] not in _STARS and tb[j] not in _STARS:
            return _chars_meet(ta[i], tb[j]) and meet(i + 1, j + 1)
        return False

    return meet(0, 0)


Token = tuple[bool, frozenset[str]]
"""(negated, characters): a literal is (False, {c}), `?` is (True, {}), `[!ab]` is (True, {a, b})."""
_STAR_ALL: Token = (True, frozenset("*"))
_STAR_PART: Token = (True, frozenset("*."))
_STARS = (_STAR_ALL, _STAR_PART)
_ANY: Token = (True, frozenset())
_NOT_DOT: Token = (True, frozenset("."))


def _absorbs(star: Token, other: Token) -> bool:
    """Whether `star` can take one more character matching `other` (or stand in for another star)."""
    return other in _STARS or star == _STAR_ALL or _chars_meet(other, _NOT_DOT)


def _tokens(pattern: str) -> tuple[Token, ...]:
    """Tokens of a pattern: stars (a last `*` spans dots, others one component), `?`, `[...]` classes, literals."""
    out: list[Token] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        close = pattern.find("]", i + 2) if ch == "[" else -1
        if ch == "*":
            out.append(_STAR_ALL if i == len(pattern) - 1 else _STAR_PART)
        elif ch == "?":
            out.append(_ANY)
        elif close > 0:
            body = pattern[i + 1 : close]
            negated = body.startswith("!")
            body = body[1:] if negated else body
            chars: set[str] = set()
            k = 0
            while k < len(body):
                if k + 2 < len(body) and body[k + 1] == "-":
                    chars.update(chr(c) for c in range(ord(body[k]), ord(body[k + 2]) + 1))
                    k += 3
                else:
                    chars.add(body[k])
                    k += 1
            out.append((negated, frozenset(chars)))
            i = close + 1
            continue
        else:
            out.append((False, frozenset(ch)))
        i += 1
    return tuple(out)


def _chars_meet(x: Token, y: Token) -> bool:
    """Whether one character can match both tokens."""
    (nx, cx), (ny, cy) = x, y
    if nx and ny:
        return True
    if nx:
        return bool(cy - cx)
    if ny:
        return bool(cx - cy)
    return bool(cx & cy)
