"""MkDocs hook: the reference pages, generated from the code at every build (never committed).

- ``reference/cli.md``: every command and option, read from the Typer app;
- ``reference/manifest.md``: ``speedtrap.toml``, from the spec's JSON Schema (``speedtrap.spec``);
- ``reference/recording.md`` and ``reference/report.md``: from ``schemas/*.schema.json``.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import typer
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for name, text in (
        ("reference/cli.md", cli_page()),
        ("reference/manifest.md", manifest_page()),
        ("reference/recording.md", schema_page("recording", "The recording file (`speedtrap record`)")),
        ("reference/report.md", schema_page("report", "The report JSON (`report.json`)")),
    ):
        files.append(File.generated(config, name, content=text))
    return files


# -- the CLI ------------------------------------------------------------------------------------


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|").replace("<", "&lt;")


def _command(cmd: Any, path: list[str], out: list[str]) -> None:
    """One command's section (Typer's commands are click's, vendored: read by their attributes)."""
    if getattr(cmd, "hidden", False):
        return
    name = " ".join(path)
    out.append(f"## `{name}`\n")
    if cmd.help:
        out.append(cmd.help.strip().split("\n\n")[0].replace("\n", " ") + "\n")
    params = [p for p in cmd.params if p.param_type_name == "option" and not getattr(p, "hidden", False)]
    args = [p for p in cmd.params if p.param_type_name == "argument"]
    if args:
        out.append("Arguments: " + ", ".join(f"`{a.name.upper()}`" for a in args) + "\n")
    if params:
        out.append("| option | default | what it does |\n|---|---|---|")
        for p in params:
            flags = ", ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts))
            default = "" if p.default in (None, False, ()) or callable(p.default) else f"`{p.default}`"
            out.append(f"| {flags} | {_cell(default)} | {_cell(p.help or '')} |")
        out.append("")
    if hasattr(cmd, "commands"):
        for sub in sorted(cmd.commands):
            _command(cmd.commands[sub], [*path, sub], out)


def cli_page() -> str:
    from speedtrap.cli import app

    root = typer.main.get_command(app)
    out = [
        "# CLI reference\n",
        "Generated from the Typer app at every docs build (`speedtrap COMMAND --help` prints the same).",
        "Every command takes `--json` for one JSON object on stdout; bad input is one line and exit 2.\n",
    ]
    for name in sorted(root.commands):
        _command(root.commands[name], ["speedtrap", name], out)
    return "\n".join(out) + "\n"


# -- the manifest -------------------------------------------------------------------------------


def _type(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1]
    if "enum" in prop:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "anyOf" in prop:
        return " \\| ".join(_type(p, defs) for p in prop["anyOf"])
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}), defs)}"
    if kind == "object" and "additionalProperties" in prop and isinstance(prop["additionalProperties"], dict):
        return f"table of {_type(prop['additionalProperties'], defs)}"
    return str(kind)


def _table(schema: dict[str, Any], defs: dict[str, Any], prefix: str) -> list[str]:
    out = ["| key | type | default | what it is |", "|---|---|---|---|"]
    for key, prop in schema.get("properties", {}).items():
        default = f"`{json.dumps(prop['default'])}`" if "default" in prop else ""
        out.append(f"| `{prefix}{key}` | {_type(prop, defs)} | {default} | {_cell(prop.get('description', ''))} |")
    return [*out, ""]


def manifest_page() -> str:
    from speedtrap.manifest import _parse as _manifest
    from speedtrap.spec import manifest_schema

    schema = manifest_schema()
    defs = schema["$defs"]
    out = [
        "# Manifest reference: `speedtrap.toml`\n",
        "Generated from the spec (`speedtrap.spec.manifest_schema()`), the same JSON Schema that is published as",
        "`schemas/manifest.schema.json`: point your editor's TOML plugin (Taplo, Even Better TOML) at it with",
        "`#:schema ./schemas/manifest.schema.json` on the manifest's first line.\n",
        "## Every table at once\n",
        "```toml\n" + textwrap.dedent((_manifest.__doc__ or "").split("::", 1)[-1]).strip("\n") + "\n```\n",
    ]
    props = schema["properties"]
    out += ["## `[target]` (in-process)\n", *_table(props["target"], defs, "target.")]
    out += ["A server target's keys (`launch`, `model`, `health`, ...) are shown in the example above.\n"]
    out += ["## `[[patches]]`\n", *_table(props["patches"]["items"], defs, "")]
    out += ["## `[probe]`\n", "A union tagged on `kind`:\n"]
    for name in ("DivergenceProbe", "RecallProbe", "CommandProbe"):
        d = defs[name]
        out += [f"### `kind = \"{d['properties']['kind'].get('const', d['properties']['kind'].get('default'))}\"`\n",
                _cell(d.get("description", "")) + "\n", *_table(d, defs, "probe.")]  # fmt: skip
    out += ["## `[verdict]`\n", *_table(props["verdict"], defs, "verdict.")]
    out += [
        "The default verdict is `worst.kl_p99 <= 0.1` (the worst phase's 99th-percentile KL in nats), the",
        "same as `speedtrap check --against`'s. A bound left out is derived from a noise floor stored in the",
        "reference recording (`speedtrap record --floor`): `floor + max(0.1, floor)`. Which way a figure",
        "fails comes from the metric registry (`speedtrap.spec.metric`): KL figures fail above, `same_top1`",
        "and `accuracy` below; a command probe's own figure fails above unless `direction` says otherwise.\n",
    ]
    from speedtrap.spec import metric, metric_names

    out += ["## Metrics\n", "| metric | unit | fails when | what it is |", "|---|---|---|---|"]
    out += [
        f"| `{n}` | {metric(n).unit} | {metric(n).polarity} the bound | {metric(n).summary} |" for n in metric_names()
    ]
    return "\n".join(out) + "\n"


# -- JSON schemas of files ------------------------------------------------------------------------


def schema_page(name: str, title: str) -> str:
    schema = json.loads((ROOT / "schemas" / f"{name}.schema.json").read_text())
    defs = schema.get("$defs", {})
    out = [f"# {title}\n", _cell(schema.get("description", "")) + "\n",
           f"Generated from `schemas/{name}.schema.json` (JSON Schema draft 2020-12).\n"]  # fmt: skip
    if "properties" in schema:
        out += ["## Top level\n", *_table(schema, defs, "")]
    for key, d in defs.items():
        if "properties" in d:
            out += [f"## `{key}`\n", _cell(d.get("description", "")) + "\n", *_table(d, defs, "")]
    return "\n".join(out) + "\n"
