"""A run's plan drawn as a picture: each step, wait, approval and join in plan order, the child runs hanging off
the step that started them, each box coloured and marked by its state. Pure: no Django, no I/O.

The state of a step comes from the recovery boundary (durableruns.boundary) and a few facts beside it (which
steps their `when=` skipped, whether the run is in a live worker's hands); the drawing is an SVG string whose
every name is escaped (names come from users' code), with a legend, a <title> on every box and a text
equivalent (`describe`), so colour is never the only signal: each state has a symbol, and some a pattern.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape

from durableruns.boundary import Boundary, Zone
from durableruns.waits import Child


class State(enum.StrEnum):
    """What a box of the drawing says about its step or child run."""

    DONE = "done"
    RUNNING = "running"
    IN_DOUBT = "in_doubt"
    WAITING = "waiting"
    SKIPPED = "skipped"
    FAILED = "failed"
    REMAINING = "remaining"
    CANCELLED = "cancelled"  # a child run only: a step is never cancelled, its run is


@dataclass(frozen=True, kw_only=True)
class Look:
    """How a state is drawn: its words, its symbol, its stroke and fill, and its border's dashes."""

    label: str
    symbol: str
    stroke: str
    fill: str
    dash: str = ""  # an SVG stroke-dasharray; "" for a solid border
    hatched: bool = False  # filled with diagonal lines over its fill


# Okabe-Ito colours (told apart with the common colour blindnesses), each with a symbol of its own.
LOOKS: dict[State, Look] = {
    State.DONE: Look(label="done", symbol="\u2713", stroke="#007a5a", fill="#e3f4ee"),
    State.RUNNING: Look(label="running", symbol="\u25ba", stroke="#0061a0", fill="#e1eef8"),
    State.IN_DOUBT: Look(label="in doubt", symbol="?", stroke="#b07800", fill="#fdf1d6", hatched=True),
    State.WAITING: Look(label="waiting", symbol="\u2016", stroke="#a8437e", fill="#f8e8f1", dash="8 3"),
    State.SKIPPED: Look(label="skipped by when=", symbol="\u21b7", stroke="#707070", fill="#f4f4f4", dash="2 3"),
    State.FAILED: Look(label="failed", symbol="\u2717", stroke="#c43c00", fill="#fbe5da"),
    State.REMAINING: Look(label="remaining", symbol="\u25cb", stroke="#8a8a8a", fill="#ffffff", dash="5 4"),
    State.CANCELLED: Look(label="cancelled", symbol="\u2298", stroke="#404040", fill="#e6e6e6"),
}

KIND_LABELS: dict[str, str] = {
    "sleep": "sleep",
    "wait_for": "wait for an event",
    "approval": "approval",
    "join": "join: waits for its child runs",
}

# A run status (RunStatus) as a child run's box shows it.
CHILD_STATES: dict[str, State] = {
    "pending": State.REMAINING,
    "running": State.RUNNING,
    "waiting": State.WAITING,
    "needs_decision": State.IN_DOUBT,
    "completed": State.DONE,
    "failed": State.FAILED,
    "cancelled": State.CANCELLED,
}
ENDED = frozenset({"completed", "failed", "cancelled"})

NAME_CHARS = 30  # a longer name is cut with an ellipsis in its box; its <title> holds it whole
CHILD_CHARS = 30
CHILDREN_DRAWN = 6  # past this, one box says how many more child runs the step started


@dataclass(frozen=True, kw_only=True)
class ChildBox:
    """A child run as drawn: its run_id, the part of it that names it under its step, its status and state."""

    run_id: str
    label: str
    status: str
    state: State
    url: str = ""


@dataclass(frozen=True, kw_only=True)
class StepBox:
    """One step of the plan as drawn."""

    name: str
    kind: str  # the plan's word for it: a call's policy, or a wait's kind (durableruns.waits.Kind)
    state: State
    detail: str = ""
    children: tuple[ChildBox, ...] = ()

    @property
    def kind_label(self) -> str:
        return KIND_LABELS.get(self.kind, f"step \u00b7 {self.kind}" if self.kind else "step")


def step_states(b: Boundary, *, skipped: Collection[str] = (), live: bool = False) -> dict[str, State]:
    """The state of each step of the boundary's plan, in plan order. `skipped`: steps whose latest attempt is
    completed as skipped by its `when=`; `live`: the run is in a worker's hands under a lease not expired, so its
    step in doubt is running. A wait of a run that has ended waits no more: it remains."""
    ended = b.status in ENDED
    states: dict[str, State] = {}
    for step in b.plan:
        zone = b.zone(step)
        if zone is Zone.DONE:
            states[step] = State.SKIPPED if step in skipped else State.DONE
        elif zone is Zone.IN_DOUBT:
            states[step] = State.RUNNING if live and step == b.in_doubt[-1] else State.IN_DOUBT
        elif zone is Zone.FAILED:
            states[step] = State.FAILED
        elif zone is Zone.WAITING:
            states[step] = State.REMAINING if ended else State.WAITING
        elif step in b.turns and not ended:
            states[step] = State.WAITING  # its turn under a rate limit
        else:
            states[step] = State.REMAINING
    return states


def child_boxes(
    parent: str, plan: Sequence[str], children: Iterable[Child], urls: Mapping[str, str] | None = None
) -> dict[str, tuple[ChildBox, ...]]:
    """The child runs by the step that started them, read from their run_ids (`<parent>/<step>/<key>`,
    durableruns.children): the longest step name that fits wins. A child no step of the plan names is left out."""
    by_length = sorted(plan, key=len, reverse=True)
    found: dict[str, list[ChildBox]] = {}
    for child in children:
        for step in by_length:
            prefix = f"{parent}/{step}/"
            if child.run_id.startswith(prefix):
                state = CHILD_STATES.get(child.status, State.REMAINING)
                found.setdefault(step, []).append(
                    ChildBox(
                        run_id=child.run_id,
                        label=child.run_id[len(prefix) :],
                        status=child.status,
                        state=state,
                        url=(urls or {}).get(child.run_id, ""),
                    )
                )
                break
    return {step: tuple(found[step]) for step in plan if step in found}


def boxes(
    steps: Iterable[tuple[str, str]],
    states: Mapping[str, State],
    *,
    details: Mapping[str, str] | None = None,
    children: Mapping[str, tuple[ChildBox, ...]] | None = None,
) -> tuple[StepBox, ...]:
    """The boxes of a plan (name, kind), in its order, each with its state (remaining where none is given)."""
    return tuple(
        StepBox(
            name=name,
            kind=kind,
            state=states.get(name, State.REMAINING),
            detail=(details or {}).get(name, ""),
            children=(children or {}).get(name, ()),
        )
        for name, kind in steps
    )


def describe(box: StepBox) -> str:
    """One sentence for a box: its name, kind, state and detail, and its child runs' states."""
    look = LOOKS[box.state]
    text = f"{box.name} ({box.kind_label}): {look.label}"
    if box.detail.startswith(look.label):  # "done at 14:07 (attempt 1)" says its state already
        text = f"{box.name} ({box.kind_label}): {box.detail}"
    elif box.detail:
        text += f", {box.detail}"
    if box.children:
        counts: dict[str, int] = {}
        for child in box.children:
            counts[LOOKS[child.state].label] = counts.get(LOOKS[child.state].label, 0) + 1
        said = ", ".join(f"{n} {label}" for label, n in counts.items())
        text += f"; started {len(box.children)} child run{'' if len(box.children) == 1 else 's'} ({said})"
    return text


# -- the SVG -------------------------------------------------------------------------------------------------

MARGIN = 16
BOX_W, BOX_H, GAP = 320, 46, 26
CHILD_X = MARGIN + BOX_W + 56
CHILD_W, CHILD_H, CHILD_GAP = 290, 24, 6
JOIN_X = CHILD_X + CHILD_W + 18
WIDTH = JOIN_X + 14
LEGEND_COLUMNS, LEGEND_W, LEGEND_ROW = 4, 170, 24
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', sans-serif"


def clean(text: str) -> str:
    """Escape `text` for XML (text or attribute), its control characters (not allowed in XML) replaced."""
    shown = "".join(ch if ch >= " " or ch in "\t\n" else "\ufffd" for ch in text)
    return escape(shown, quote=True)


def cut(text: str, limit: int) -> str:
    """`text`, cut to `limit` characters with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _shape(x: float, y: float, w: float, h: float, look: Look, *, radius: int = 6, width: float = 1.6) -> str:
    dash = f' stroke-dasharray="{look.dash}"' if look.dash else ""
    rect = (
        f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="{radius}" fill="{look.fill}" '
        f'stroke="{look.stroke}" stroke-width="{width}"{dash}/>'
    )
    if look.hatched:
        rect += f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="{radius}" fill="url(#dr-hatch)"/>'
    return rect


def _mark(cx: float, cy: float, r: float, look: Look, size: int) -> str:
    return (
        f'<circle cx="{cx}" cy="{cy}" r="{r}" fill="{look.stroke}"/>'
        f'<text x="{cx}" y="{cy}" text-anchor="middle" dominant-baseline="central" fill="#ffffff" '
        f'font-size="{size}" font-weight="700" aria-hidden="true">{clean(look.symbol)}</text>'
    )


def _legend(top: float) -> tuple[list[str], float]:
    out = ['<g class="dr-plan-legend" aria-label="legend">']
    for n, state in enumerate(State):
        look = LOOKS[state]
        x = MARGIN + (n % LEGEND_COLUMNS) * LEGEND_W
        y = top + (n // LEGEND_COLUMNS) * LEGEND_ROW
        out.append(
            f'<g data-state="{state.value}"><title>{clean(look.label)}</title>'
            f"{_shape(x, y, 18, 18, look, radius=3, width=1.4)}{_mark(x + 9, y + 9, 7, look, 10)}"
            f'<text x="{x + 24}" y="{y + 9}" dominant-baseline="central">{clean(look.label)}</text></g>'
        )
    out.append("</g>")
    rows = -(-len(State) // LEGEND_COLUMNS)
    return out, top + rows * LEGEND_ROW + 12


def _children(box: StepBox, y: float) -> tuple[list[str], list[float], float]:
    """The child boxes of one step from height `y`: their SVG, their middles, and the height they take."""
    shown = list(box.children[:CHILDREN_DRAWN])
    more = len(box.children) - len(shown)
    out: list[str] = []
    middles: list[float] = []
    top = y + (BOX_H - CHILD_H) / 2 if len(shown) + (1 if more else 0) == 1 else y
    for n, child in enumerate(shown):
        cy = top + n * (CHILD_H + CHILD_GAP)
        look = LOOKS[child.state]
        said = f"child run {child.run_id}: {child.status} ({look.label})"
        inner = (
            f"<title>{clean(said)}</title>{_shape(CHILD_X, cy, CHILD_W, CHILD_H, look, radius=4, width=1.3)}"
            f"{_mark(CHILD_X + 12, cy + CHILD_H / 2, 8, look, 10)}"
            f'<text x="{CHILD_X + 26}" y="{cy + CHILD_H / 2}" dominant-baseline="central" font-size="12">'
            f"{clean(cut(child.label, CHILD_CHARS))} \u2014 {clean(child.status)}</text>"
        )
        if child.url:
            inner = f'<a href="{clean(child.url)}">{inner}</a>'
        out.append(
            f'<g class="dr-plan-child" data-run="{clean(child.run_id)}" data-state="{child.state.value}" '
            f'aria-label="{clean(said)}">{inner}</g>'
        )
        middles.append(cy + CHILD_H / 2)
    if more:
        cy = top + len(shown) * (CHILD_H + CHILD_GAP)
        look = LOOKS[State.REMAINING]
        said = f"and {more} more child run{'' if more == 1 else 's'}"
        out.append(
            f'<g class="dr-plan-more"><title>{clean(said)}</title>'
            f"{_shape(CHILD_X, cy, CHILD_W, CHILD_H, look, radius=4, width=1.0)}"
            f'<text x="{CHILD_X + 12}" y="{cy + CHILD_H / 2}" dominant-baseline="central" font-size="12">'
            f"{clean(said)}</text></g>"
        )
        middles.append(cy + CHILD_H / 2)
    count = len(middles)
    return out, middles, max(BOX_H, count * (CHILD_H + CHILD_GAP) - CHILD_GAP)


def draw(plan: Sequence[StepBox], *, title: str) -> str:
    """The plan as an SVG document: a legend, then a vertical chain of boxes joined by arrows, child runs hanging
    off the step that started them, and each join shown waiting on the child runs started before it."""
    body: list[str] = []
    legend, y = _legend(MARGIN)
    hanging: list[tuple[float, ...]] = []  # the middles of the child boxes started so far, not joined yet
    bottom = y
    for n, box in enumerate(plan):
        look = LOOKS[box.state]
        mid = y + BOX_H / 2
        said = describe(box)
        if n:
            body.append(
                f'<line x1="{MARGIN + BOX_W / 2}" y1="{bottom}" x2="{MARGIN + BOX_W / 2}" y2="{y - 2}" '
                f'stroke="#555555" stroke-width="1.5" marker-end="url(#dr-arrow)"/>'
            )
        kind_line = f"{n + 1}. {box.kind_label} \u00b7 {look.label}"
        body.append(
            f'<g class="dr-plan-step" data-step="{clean(box.name)}" data-kind="{clean(box.kind)}" '
            f'data-state="{box.state.value}" aria-label="{clean(said)}"><title>{clean(said)}</title>'
            f"{_shape(MARGIN, y, BOX_W, BOX_H, look)}{_mark(MARGIN + 20, mid, 12, look, 13)}"
            f'<text x="{MARGIN + 42}" y="{y + 17}" font-weight="700">{clean(cut(box.name, NAME_CHARS))}</text>'
            f'<text x="{MARGIN + 42}" y="{y + 35}" font-size="11" fill="#444444">{clean(cut(kind_line, 46))}</text>'
            f"</g>"
        )
        height: float = BOX_H
        if box.children:
            drawn, middles, height = _children(box, y)
            for cmid in middles:
                body.append(
                    f'<path d="M{MARGIN + BOX_W},{mid} H{CHILD_X - 24} V{cmid} H{CHILD_X - 2}" fill="none" '
                    f'stroke="#555555" stroke-width="1.2" marker-end="url(#dr-arrow)"/>'
                )
            body.extend(drawn)
            hanging.append(tuple(middles))
        if box.kind == "join" and hanging:
            waited = [m for group in hanging for m in group]
            path = "".join(f"M{CHILD_X + CHILD_W},{m} H{JOIN_X} " for m in waited)
            body.append(
                f'<path class="dr-plan-join" d="{path}M{JOIN_X},{min(waited)} V{mid} H{MARGIN + BOX_W + 2}" '
                f'fill="none" stroke="#555555" stroke-width="1.2" stroke-dasharray="4 3" '
                f'marker-end="url(#dr-arrow)"><title>{clean(box.name)} waits for these child runs</title>'
                f"</path>"
            )
            hanging = []
        bottom = y + BOX_H
        y += height + GAP
    total = y - GAP + MARGIN
    summary = "; ".join(describe(box) for box in plan) or "no steps"
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="dr-plan" width="{WIDTH}" height="{total}" '
        f'viewBox="0 0 {WIDTH} {total}" role="img" aria-labelledby="dr-plan-title dr-plan-desc" '
        f'font-family="{clean(FONT)}" font-size="13" fill="#1a1a1a">'
        f'<title id="dr-plan-title">{clean(title)}</title><desc id="dr-plan-desc">{clean(summary)}</desc>'
        f"<defs>"
        f'<pattern id="dr-hatch" width="8" height="8" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
        f'<line x1="0" y1="0" x2="0" y2="8" stroke="#b07800" stroke-width="2" stroke-opacity="0.35"/></pattern>'
        f'<marker id="dr-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555555"/></marker>'
        f"</defs>"
    )
    return "\n".join([head, *legend, *body, "</svg>"]) + "\n"
