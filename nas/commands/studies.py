"""``nas studies``: list the studies in a storage (a table; piped, tab-separated rows), or show one."""

from __future__ import annotations

import argparse

from rich.table import Table

from nas.commands._common import STORAGE_HELP, UsageError, console, write_raw
from nas.commands._front import print_fidelity


def add_parser(sub: argparse._SubParsersAction) -> None:
    st = sub.add_parser("studies", help="list studies in a storage, or show one")
    st.add_argument("--storage", default=None, help=STORAGE_HELP)
    st.add_argument("--study", default=None, help="show this study only (exit 2 if absent)")


def run(args: argparse.Namespace) -> None:
    import optuna
    from optuna.trial import TrialState

    from nas.results.fidelity import fidelity
    from nas.search.loop import n_complete, n_infeasible, n_truncated
    from nas.search.storage import open_storage, resolve_storage

    storage = resolve_storage(args.storage)
    store = open_storage(storage, write=False)
    summaries = optuna.get_all_study_summaries(store, include_best_trial=False)
    if args.study is not None:
        summaries = [s for s in summaries if s.study_name == args.study]
        if not summaries:
            raise UsageError(f"no study named {args.study!r} in {storage}")
    # "trained": what --trials counts, the truncated ones (cut short by max_train_seconds, off the
    # front) among them; a COMPLETE trial that broke a hard budget was never trained;
    # "proxy_rho": nas verify's Spearman ρ of short- vs long-run accuracy ("-" before a verify)
    columns = (
        *("study", "trained", "truncated", "over_budget", "pruned", "failed", "running", "total", "started"),
        "proxy_rho",
    )
    rows = []
    for s in summaries:
        study = optuna.load_study(study_name=s.study_name, storage=store)
        states = [t.state for t in study.get_trials(deepcopy=False)]
        found = fidelity(study)
        rows.append(
            (
                s.study_name,
                str(n_complete(study)),
                str(n_truncated(study)),
                str(n_infeasible(study)),
                *(str(states.count(x)) for x in (TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)),
                str(len(states)),
                f"{s.datetime_start:%Y-%m-%d %H:%M}" if s.datetime_start else "-",
                "-" if found is None or found.proxy.spearman is None else f"{found.proxy.spearman:.2f}",
            )
        )
    if not console.is_terminal:  # piped: whole names, one tab-separated row per study, for scripts
        write_raw("".join("\t".join(row) + "\n" for row in [columns, *rows]))
        return
    table = Table(title=f"studies in {storage}")
    for col in columns:
        table.add_column(col, overflow="fold")  # a narrow terminal folds a long name, never cuts it
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if args.study is not None:  # one study: its proxy fidelity in words, below its row
        print_fidelity(optuna.load_study(study_name=args.study, storage=store), table=False)
