"""`manage.py approvals list|show|approve|reject|confirm`: the approval cards of
a tenant from the command line, as the user `--as` names, decided through
the approval service (hash-bound, every rule of REST and the live page;
`decided_via` "cli"). Exit codes and output: runs/management/cli.py."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from approvals.models import Approval
from approvals.selectors import approval_card
from approvals.services import approval_confirm, approval_decide, approval_for
from runs.errors import RunError
from runs.management.cli import (
    EXIT_CODES_HELP,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    acting_user,
    card_lines,
    cli_error,
    common_options,
    emit_error_json,
    emit_json,
    refusal,
    safe,
)
from runs.services import scoping

STATUSES = [s for s, _ in Approval.STATUSES]
DECISION_OPTIONS = {"request_hash": "--request-hash", "reason": "--reason", "took_effect": "--took-effect"}


class Command(BaseCommand):
    requires_system_checks: list[str] = []  # an operator's quick read; `manage.py check` is the deploy's
    help = (
        "Approval cards as a user (--as): list, show APPROVAL, and decide one — approve, reject, or confirm "
        "whether an unknown outcome took effect — bound to the request hash of the card shown. " + EXIT_CODES_HELP + "."
    )

    def add_arguments(self, parser):
        common = common_options()
        sub = parser.add_subparsers(
            dest="action",
            required=True,
            metavar="{list,show,approve,reject,confirm}",
            help="what to do (each has --help)",
        )

        p = sub.add_parser(
            "list",
            parents=[common],
            help="approvals waiting for a decision, oldest first (the inbox), with their cards",
            description="Pending approvals the user may decide, oldest first; --status for decided ones. "
            + EXIT_CODES_HELP,
        )
        p.add_argument(
            "--status", choices=STATUSES, default="pending", help="approvals in this status (default pending)"
        )
        p.add_argument("--run", metavar="RUN_ID", help="only this run's approvals")
        p.add_argument(
            "--tenant",
            metavar="NAME",
            help="a superuser: the approvals of this tenant (read-only: a superuser decides in its own tenant only)",
        )
        p.add_argument(
            "--limit", type=int, default=200, metavar="N", help="at most N approvals, 1 to 200 (default 200)"
        )

        p = sub.add_parser(
            "show",
            parents=[common],
            help="one approval's card: tool, arguments, side effect, notice, request hash, decisions open",
            description="One approval's card. " + EXIT_CODES_HELP,
        )
        p.add_argument("approval", metavar="APPROVAL_ID", help="the approval's id (from `approvals list`)")

        for action, verb in (("approve", "Approve"), ("reject", "Reject")):
            p = sub.add_parser(
                action,
                parents=[common],
                help=f"{verb.lower()} a pending approval, bound to the request hash of the card shown",
                description=f"{verb} a pending approval. The card is printed first; the decision is bound to "
                "--request-hash (the hash of the card the operator saw; a card that changed since is a conflict, "
                "approval_stale) or, at a terminal, to the card just shown once confirmed. Refusals are printed "
                "with their code (approval_decided, approval_expired, run_deadline_passed, ...; exit 4). "
                + EXIT_CODES_HELP,
            )
            p.add_argument("approval", metavar="APPROVAL_ID", help="the approval's id (from `approvals list`)")
            self.decision_options(p)

        p = sub.add_parser(
            "confirm",
            parents=[common],
            help="say whether an unknown outcome took effect (nothing is sent again)",
            description="For an interrupted or uncertain side effect: confirm whether the call took effect. "
            "Nothing is sent again; bound to --request-hash like approve. " + EXIT_CODES_HELP,
        )
        p.add_argument("approval", metavar="APPROVAL_ID", help="the approval's id (from `approvals list`)")
        took = p.add_mutually_exclusive_group(required=True)
        took.add_argument("--took-effect", dest="took_effect", action="store_true", help="the call took effect")
        took.add_argument("--not-taken", dest="took_effect", action="store_false", help="the call did not take effect")
        self.decision_options(p)

    @staticmethod
    def decision_options(p) -> None:
        p.add_argument(
            "--request-hash",
            metavar="HASH",
            help="the request hash of the card you saw (from `approvals list` or `show`); needed unless you "
            "confirm at a prompt",
        )
        p.add_argument(
            "--reason", default="", metavar="TEXT", help="why (recorded with the decision; at most 2000 characters)"
        )

    def handle(self, *args, **opts):
        self.json = opts["json"]
        try:
            user = acting_user(opts["as_user"])
            getattr(self, "do_" + opts["action"])(user, opts)
        except CommandError as error:
            if self.json:
                emit_error_json(error)
            raise

    def out(self, value: Any, text: str) -> None:
        if self.json:
            emit_json(self.stdout, value)
        else:
            self.stdout.write(text)

    def approval_of(self, user, ref: str, *, acting: bool = False) -> Approval:
        try:
            return approval_for(user=user, approval_id=ref, acting=acting)
        except RunError:
            raise cli_error(
                "not_found", f"no approval {ref} that {user.get_username()} may see", exit_code=EXIT_NOT_FOUND
            ) from None

    # -- the subcommands ------------------------------------------------------------------------------

    def do_list(self, user, opts) -> None:
        if not 1 <= opts["limit"] <= 200:
            raise cli_error("invalid", "--limit: from 1 to 200", exit_code=EXIT_USAGE)
        # What the user may decide (its own tenant's); a superuser may look at another tenant's by name.
        qs = scoping.approvals_actionable_by(user)
        if opts["tenant"]:
            seen = scoping.approvals_visible_to(user) if scoping.sees_every_tenant(user) else qs
            qs = scoping.tenant_named(seen, opts["tenant"])
        qs = qs.select_related("run__agent", "decided_by").filter(status=opts["status"])
        if opts["run"]:
            run = scoping.as_uuid(opts["run"])
            if run is None:
                raise cli_error("invalid", "--run: must be a run's id", exit_code=EXIT_USAGE)
            qs = qs.filter(run_id=run)
        order = ("created_at", "id") if opts["status"] == "pending" else ("-created_at", "-id")
        cards = [approval_card(a) for a in qs.order_by(*order)[: opts["limit"]]]
        blocks = [
            "\n".join(card_lines(c) + [f"run        {c['run']} ({safe(c['agent'])}, {c['run_status']})"]) for c in cards
        ]
        self.out({"results": cards}, "\n\n".join(blocks) or f"no {opts['status']} approvals")

    def do_show(self, user, opts) -> None:
        approval = self.approval_of(user, opts["approval"])
        card = approval_card(approval)
        self.out(
            card,
            "\n".join(card_lines(card) + [f"run        {card['run']} ({safe(card['agent'])}, {card['run_status']})"]),
        )

    def do_approve(self, user, opts) -> None:
        self.decide(
            user,
            opts,
            lambda hash_: approval_decide(
                user=user,
                approval_id=opts["approval"],
                approve=True,
                request_hash=hash_,
                reason=opts["reason"],
                via="cli",
            ),
        )

    def do_reject(self, user, opts) -> None:
        self.decide(
            user,
            opts,
            lambda hash_: approval_decide(
                user=user,
                approval_id=opts["approval"],
                approve=False,
                request_hash=hash_,
                reason=opts["reason"],
                via="cli",
            ),
        )

    def do_confirm(self, user, opts) -> None:
        self.decide(
            user,
            opts,
            lambda hash_: approval_confirm(
                user=user,
                approval_id=opts["approval"],
                request_hash=hash_,
                took_effect=opts["took_effect"],
                reason=opts["reason"],
                via="cli",
            ),
        )

    def decide(self, user, opts, decision) -> None:
        """Show the card, then decide bound to the hash the operator saw: --request-hash, or the card just
        shown once confirmed at a prompt. The service checks everything else (scope, permission, hash,
        the run's deadline...)."""
        approval = self.approval_of(user, opts["approval"], acting=True)
        card = approval_card(approval)
        if not self.json:
            self.stdout.write("\n".join(card_lines(card)))
        request_hash = opts["request_hash"]
        if not request_hash:
            if self.json or not sys.stdin.isatty():
                raise cli_error(
                    "request_hash_required",
                    "--request-hash: give the request hash of the card you decide (shown by `approvals show`)",
                    exit_code=EXIT_USAGE,
                )
            verb = (
                opts["action"]
                if opts["action"] != "confirm"
                else ("confirm it took effect" if opts["took_effect"] else "confirm it did not take effect")
            )
            answer = input(f"{verb} this card (request hash {card['request_hash'][:12]}…)? [y/N] ").strip().lower()
            if answer not in ("y", "yes"):
                raise cli_error("not_decided", "nothing decided", exit_code=EXIT_USAGE)
            request_hash = card["request_hash"]
        try:
            decided = decision(request_hash)
        except RunError as exc:
            raise refusal(exc, options=DECISION_OPTIONS) from None
        text = f"{decided.status} by {user.get_username()} via cli" + (
            f": {safe(decided.reason)}" if decided.reason else ""
        )
        self.out(approval_card(decided), text)
