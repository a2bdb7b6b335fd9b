"""IAM policy evaluation, the part of AWS's rules that identity policies like ours use.

A request ``(action, resource, context)`` is allowed when some statement allows it and none denies
it. A statement applies when its ``Action`` (case-insensitive, ``*`` and ``?`` wildcards) and
``Resource`` (case-sensitive wildcards) match and its ``Condition`` holds. An action AWS does not
scope to resources is requested on ``"*"``, which only ``"Resource": "*"`` matches, as in AWS.
A condition key missing from the context fails every operator except the negated ones, as in AWS.
An operator not implemented here raises: an unsupported policy fails loudly, never silently open.
"""

from __future__ import annotations

import json
import re


def allowed(policies: list[dict], action: str, resource: str, context: dict[str, str] | None = None) -> bool:
    """Whether ``policies`` (policy documents) allow ``action`` on ``resource``."""
    return decision(policies, action, resource, context) == "allow"


def decision(policies: list[dict], action: str, resource: str, context: dict[str, str] | None = None) -> str | None:
    """``"deny"`` if a statement denies, else ``"allow"`` if one allows, else None. ``Principal`` is not
    read: a resource policy given here must name everyone ("*"), as the bucket's does."""
    verdict = None
    for doc in policies:
        for st in statements(doc):
            if applies(st, action, resource, context or {}):
                if st.get("Effect") == "Deny":
                    return "deny"
                verdict = "allow"
    return verdict


def statements(doc) -> list[dict]:
    doc = json.loads(doc) if isinstance(doc, str) else doc
    st = doc.get("Statement", [])
    return st if isinstance(st, list) else [st]


def actions_of(doc) -> set[str]:
    """Every ``Action`` an ``Allow`` statement of ``doc`` names (as written)."""
    return {a for st in statements(doc) if st.get("Effect") == "Allow" for a in _list(st.get("Action", []))}


def applies(st: dict, action: str, resource: str, context: dict[str, str]) -> bool:
    if "Action" in st and not any(_like(p, action, fold=True) for p in _list(st["Action"])):
        return False
    if "NotAction" in st and any(_like(p, action, fold=True) for p in _list(st["NotAction"])):
        return False
    if "Resource" in st and not any(_like(p, resource) for p in _list(st["Resource"])):
        return False
    if "NotResource" in st and any(_like(p, resource) for p in _list(st["NotResource"])):
        return False
    return all(_holds(op, key, values, context) for op, pairs in st.get("Condition", {}).items()
               for key, values in pairs.items())


def _list(x) -> list:
    return x if isinstance(x, list) else [x]


def _like(pattern: str, value: str, fold: bool = False) -> bool:
    """IAM wildcards: ``*`` any run of characters, ``?`` one character; nothing else is special."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.IGNORECASE | re.DOTALL if fold else re.DOTALL) is not None


_OPERATORS = {
    "StringEquals": lambda v, p: v == p,
    "StringLike": lambda v, p: _like(p, v),
    "ArnEquals": lambda v, p: v == p,
    "ArnLike": lambda v, p: _like(p, v),
    "Bool": lambda v, p: v.lower() == str(p).lower(),
}


def _holds(op: str, key: str, values, context: dict[str, str]) -> bool:
    negated = op.replace("Not", "", 1) if op.startswith(("StringNot", "ArnNot")) else None
    test = _OPERATORS.get(negated or op)
    if test is None:
        raise ValueError(f"condition operator {op} is not evaluated by the rehearsal")
    if key not in context:
        return negated is not None
    hit = any(test(context[key], p) for p in _list(values))
    return not hit if negated else hit
