"""``envhub report``: write one self-contained HTML page for a run or an eval; serve it."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the ``envhub report`` command to ``app``."""
    app.command("report")(report_command)


def report_command(
    results: Path = typer.Argument(
        ..., help="A run folder written by `envhub train`, or a folder written by `envhub eval`."
    ),
    output: Path = typer.Option(
        None, "--output", "-o", help="The HTML file to write (default: RESULTS/report.html)."
    ),
    token_ids: bool = typer.Option(
        False, "--token-ids", help="Show token ids, without loading the model's tokenizer."
    ),
    serve: bool = typer.Option(
        False, "--serve", help="Then serve the page on localhost until Ctrl-C."
    ),
    port: int = typer.Option(8000, "--port", help="Port for --serve."),
) -> None:
    """Write a self-contained HTML report: learning curves and a trajectory browser.

    The page opens offline. Every token is coloured by its loss mask and
    shaded by the gap between the sampler's and the trainer's logprob (or by
    the sampler's probability).

    For a run on a remote machine, use --serve there and open it through an SSH
    tunnel (ssh -L 8000:localhost:8000 HOST), or copy the one file.

    Examples:
        envhub report outputs/train/quickstart
        envhub report outputs/eval/calculator-smollm2-20261123-091258 -o calc.html
        envhub report outputs/train/quickstart --serve --port 8001
    """
    import json
    import time

    from envhub.cli.console import console
    from envhub.errors import ConfigError
    from envhub.report import load_decoder, make_server, write_report

    if not results.is_dir():
        raise ConfigError(f"{results} is not a folder; give a run folder or an eval folder")
    started = time.perf_counter()
    config = results / "config.json"
    model = json.loads(config.read_text()).get("model") if config.is_file() else None
    name = model.get("name") if isinstance(model, dict) else model
    decode = load_decoder(_model_folder(name)) if name and not token_ids else None
    page = write_report(results, output, decode)
    size = page.stat().st_size / 1e6
    console.print(f"wrote {page} ({size:.1f} MB in {time.perf_counter() - started:.1f} s)")
    if serve:
        server = make_server(page, "127.0.0.1", port)
        console.print(f"serving on http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()


def _model_folder(name: str) -> str:
    """The run's model as a folder or Hub id (an alias such as ``smollm2-135m`` resolved);
    the name itself when it does not resolve, so the report says the tokenizer is missing."""
    from envhub.trainer.models import resolve_model

    try:
        return resolve_model(name)
    except Exception:  # the report falls back to token ids, and says so
        return name
