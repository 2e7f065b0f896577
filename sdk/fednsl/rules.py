"""Rules as first-class objects: a head, a body of predicates, a stable string form.

A FedNSL rule (paper section 3.4) is ``r_1 ∧ … ∧ r_l → r_head``. Here a body atom is a
*symbolic predicate* over the ontology (``lactate_high``, ``map_low``, ``history_lvf_present``,
``sao2_missing``, optionally reached through a similar patient: ``similar_to:pap_high``) and a
head is a concept label or the task (``shock``). The stable string form is
``"lactate_high ∧ map_low → shock"`` (and an ASCII twin, ``"lactate_high & map_low -> shock"``);
bodies are kept in a canonical order so one rule has one string.

:class:`RuleSpace` is the enumerated, ordered, public set of bodies every hospital and the
server index the same way: a posterior over it is a fixed-length vector, which is what lets
it travel through secure aggregation as one more summed module.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from clinograph.core.errors import ConfigError

PREDICATE = re.compile(r"^(similar_to:)?[a-z][a-z0-9_=.\-]{0,95}$")
AND, ARROW = " ∧ ", " → "


@dataclass(frozen=True, order=True)
class Rule:
    """``body[0] ∧ … ∧ body[-1] → head`` with the body in canonical (sorted) order."""

    head: str
    body: tuple[str, ...]

    def __post_init__(self) -> None:
        problems = [p for p in (self.head, *self.body) if not PREDICATE.match(p)]
        if problems:
            raise ConfigError(f"Rule atoms {problems[:3]} are not predicate names (lower case, digits, _ = . -, "
                              "optionally prefixed similar_to:).")
        if not self.body:
            raise ConfigError(f"A rule for {self.head!r} needs a body of at least one predicate.")
        if tuple(sorted(set(self.body))) != self.body:
            object.__setattr__(self, "body", tuple(sorted(set(self.body))))

    def __str__(self) -> str:
        return AND.join(self.body) + ARROW + self.head

    def ascii(self) -> str:
        """The ASCII form: ``a & b -> head``."""
        return " & ".join(self.body) + " -> " + self.head

    @classmethod
    def parse(cls, text: str) -> Rule:
        """Parse either string form (``a ∧ b → h`` or ``a & b -> h``).

        Raises:
            ConfigError: no arrow, or an atom that is not a predicate name.
        """
        t = text.replace("->", "→").replace("&", "∧")
        if t.count("→") != 1:
            raise ConfigError(f"Rule {text[:120]!r} needs exactly one arrow ('→' or '->') between body and head.")
        body, head = t.split("→")
        return cls(head=head.strip(), body=tuple(sorted(a.strip() for a in body.split("∧") if a.strip())))


def _feature_of(predicate: str) -> str:
    """The feature a predicate talks about (``pap_high`` -> ``pap``), for excluding ``x_high ∧ x_low``."""
    base = predicate.removeprefix("similar_to:")
    for suffix in ("_high", "_low", "_normal", "_missing", "_present", "_absent"):
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base.split("=")[0]


@dataclass(frozen=True)
class RuleSpace:
    """Heads × the ordered bodies over ``predicates`` of length 1..``max_len`` (one feature per atom).

    The order is part of the federation's public configuration: index ``h * n_bodies + j`` of
    a posterior vector is rule ``Rule(heads[h], bodies[j])``.
    """

    heads: tuple[str, ...]
    predicates: tuple[str, ...]
    bodies: tuple[tuple[str, ...], ...]

    @classmethod
    def enumerate(cls, *, heads: Sequence[str], predicates: Sequence[str], max_len: int) -> RuleSpace:
        """Every body of 1..``max_len`` predicates on distinct features, in canonical order."""
        if not 1 <= max_len <= 3:
            raise ConfigError(f"max_len = {max_len}: bodies of 1 to 3 predicates are supported (the space grows "
                              "as |predicates|^max_len).")
        preds = tuple(sorted(set(predicates)))
        bad = [p for p in (*heads, *preds) if not PREDICATE.match(p)]
        if bad or len(set(heads)) != len(heads) or not heads:
            raise ConfigError(f"Rule space: heads must be distinct predicate names and at least one (bad: {bad[:3]}).")
        bodies: list[tuple[str, ...]] = []
        for n in range(1, max_len + 1):
            for combo in itertools.combinations(preds, n):
                feats = [_feature_of(p) for p in combo]
                if len(set(feats)) == n:
                    bodies.append(combo)
        return cls(heads=tuple(heads), predicates=preds, bodies=tuple(bodies))

    def to_json(self) -> bytes:
        """The public file the server's ``fednsl_rules`` strategy loads (heads and ordered bodies)."""
        return json.dumps({"heads": list(self.heads), "bodies": [list(b) for b in self.bodies]},
                          separators=(",", ":")).encode()

    def sha256(self) -> str:
        """SHA-256 of :meth:`to_json`: what the server's strategy pins and each hospital checks."""
        return hashlib.sha256(self.to_json()).hexdigest()

    @property
    def n_bodies(self) -> int:
        """Bodies per head (the length of one head's block)."""
        return len(self.bodies)

    @property
    def size(self) -> int:
        """Length of a posterior vector over the whole space (heads × bodies)."""
        return len(self.heads) * len(self.bodies)

    def rule(self, head: int, body: int) -> Rule:
        """The rule at (head index, body index)."""
        return Rule(head=self.heads[head], body=self.bodies[body])

    def index(self, rule: Rule) -> tuple[int, int]:
        """(head index, body index) of ``rule``; ConfigError if it is not in the space."""
        try:
            return self.heads.index(rule.head), self._body_index()[rule.body]
        except (ValueError, KeyError):
            raise ConfigError(f"Rule {str(rule)!r} is not in this rule space ({len(self.heads)} heads, "
                              f"{self.n_bodies} bodies of up to {max(map(len, self.bodies))} predicates).") from None

    def _body_index(self) -> dict[tuple[str, ...], int]:
        cache = self.__dict__.get("_bidx")
        if cache is None:
            cache = {b: i for i, b in enumerate(self.bodies)}
            object.__setattr__(self, "_bidx", cache)
        return cache

    def rules(self, head: int, bodies: Iterable[int]) -> list[Rule]:
        """Rules for one head over body indices."""
        return [self.rule(head, j) for j in bodies]
