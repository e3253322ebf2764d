"""The console's pages of the broker's dead-letter queues (``nsjms.DLQ``, ``ActiveMQ.DLQ``): a paged list per queue,
one message, retry and discard (one, or a selection of one page), through the backend's
:class:`router.deadletter.broker.BrokerDeadLetterOps` (``nsjms deadletter broker``'s operations, operator log included).

The routes are installed by :func:`install` from :func:`router.console.app.create_app`, with its helpers (rendering,
the operator-role, reason and CSRF checks all POSTs pass through first).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flask import Flask, abort, g, jsonify, render_template, request

from router.console.backend import DEAD_LETTER_ACTIONS, Backend, ConsoleRefused
from router.console.views import MAX_PER_PAGE, paginate
from router.deadletter.broker import BROKER_QUEUES
from router.security.auth import Principal

__all__ = ["MAX_ID_CHARS", "install", "selected_message_ids"]

log = logging.getLogger("nsjms.console")

MAX_ID_CHARS = 500        # a message id longer than this is not one the broker gave (refused before anything runs)
SUMMARY_ROWS = 5          # the rows of each broker queue shown on the dead-letters page itself
SUMMARY_SCAN = 100        # the messages of each broker queue the dead-letters page reads (bodies included) at most


def selected_message_ids(form: Any, refused: Callable[[str], Exception]) -> list[str]:
    """The message ids ticked in a list (``ids`` repeated), in order, without repeats (``refused`` when none, too
    many or not an id)."""
    ids: list[str] = []
    for text in form.getlist("ids"):
        text = str(text).strip()
        if not text or len(text) > MAX_ID_CHARS:
            raise refused(f"not a message id: {text[:80]!r}")
        if text not in ids:
            ids.append(text)
    if not ids:
        raise refused("select at least one item")
    if len(ids) > MAX_PER_PAGE:
        raise refused(f"at most {MAX_PER_PAGE} items at once (a page of the list), not {len(ids)}")
    return ids


def summaries(backend: Backend) -> list[dict[str, Any]]:
    """Each broker queue's count and first rows for the dead-letters page, or why it could not be read."""
    out: list[dict[str, Any]] = []
    for queue in BROKER_QUEUES:
        try:
            listing = backend.broker_dead_letters(queue, SUMMARY_SCAN)
        except ConsoleRefused as exc:
            out.append({"queue": queue, "total": None, "rows": [], "error": str(exc)})
            continue
        out.append({"queue": queue, "total": listing["total"], "complete": listing["complete"],
                    "rows": listing["dead_letters"][:SUMMARY_ROWS], "error": None})
    return out


def install(app: Flask, backend: Backend, *, page: Callable[..., Any], item: Callable[..., dict[str, Any]],
            acting: Callable[..., str], require_operator: Callable[[], None], action_form: Callable[..., str],
            who: Callable[[], Principal], list_args: Callable[..., dict[str, Any]],
            refusal_text: Callable[[ConsoleRefused], str], form_refused: Callable[[str], Exception]) -> None:
    def known(queue: str) -> str:
        if queue not in BROKER_QUEUES:
            abort(404)
        return queue

    @app.get("/deadletters/broker/<queue>")
    def broker_dead_letters(queue: str) -> Any:
        listing = backend.broker_dead_letters(known(queue))
        p = paginate(listing["dead_letters"], fields=("id", "reason", "origin", "source", "bridge", "preview"),
                     **list_args("at"))
        return page("brokerdeadletters.html", {**listing, "page": p.as_dict()}, actions=DEAD_LETTER_ACTIONS)

    @app.get("/deadletters/broker/<queue>/message")
    def broker_dead_letter(queue: str) -> Any:
        mid = request.args.get("id", "")
        data = item(lambda: backend.broker_dead_letter(known(queue), mid))
        return page("brokerdeadletter.html", data, actions=DEAD_LETTER_ACTIONS)

    @app.post("/deadletters/broker/<queue>/selected")
    def broker_dead_letters_selected(queue: str) -> Any:
        require_operator()
        known(queue)
        action = request.form.get("action", "")
        if action not in DEAD_LETTER_ACTIONS:
            raise form_refused(f"a selection of dead letters can be retried or discarded, not {action!r}")
        why = action_form(request.form)
        results: list[dict[str, Any]] = []
        for mid in selected_message_ids(request.form, form_refused):
            try:
                results.append({"id": mid, "ok": True,
                                "result": backend.broker_dead_letter_action(who(), queue, mid, action, why)})
            except ConsoleRefused as exc:
                text = refusal_text(exc)
                log.warning("console broker dead letter %s %s %s by %s: %s", action, queue, mid, who().name, text)
                results.append({"id": mid, "ok": False, "result": text})
        if request.args.get("format") == "json":
            return jsonify({"results": results})
        return render_template("selected.html", kind=f"{queue} message", action=action, results=results,
                               session=g.session)

    @app.post("/deadletters/broker/<queue>/<action>")
    def broker_dead_letter_action(queue: str, action: str) -> Any:
        why = acting(action, DEAD_LETTER_ACTIONS)
        mid = str(request.form.get("id", "")).strip()
        if not mid or len(mid) > MAX_ID_CHARS:
            raise form_refused("which message? (its id is missing)")
        result = backend.broker_dead_letter_action(who(), known(queue), mid, action, why)
        if request.args.get("format") == "json":
            return jsonify(result)
        return render_template("done.html", action=f"{action} {queue} message", gtrid=mid, result=result,
                               session=g.session, errors=[])
