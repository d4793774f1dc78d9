"""Writes two small inline lm-evaluation-harness tasks over local JSON data (nothing is
downloaded): `mtp_mc`, a multiple-choice task (loglikelihood requests: `echo`, `logprobs`,
token-id prompts), and `mtp_gen`, a generate_until task. Run by crates/mtp/tests/lm_eval.rs.

argv: the folder to write them to.
"""

import json
import os
import sys

out = sys.argv[1]
docs = [
    {"q": "fn main() {", "choices": [" }", " let", " println"], "gold": 1},
    {"q": "def add(a, b):", "choices": ["\n    return a + b", "\n    pass"], "gold": 0},
    {"q": "for i in", "choices": [" range(10):", " xs:", " 1"], "gold": 0},
]
data = os.path.join(out, "mtp_docs.jsonl")
with open(data, "w") as f:
    for d in docs:
        f.write(json.dumps(d) + "\n")
common = f"""dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
"""
with open(os.path.join(out, "mtp_mc.yaml"), "w") as f:
    f.write(
        "task: mtp_mc\n"
        + common
        + """output_type: multiple_choice
doc_to_text: "{{q}}"
doc_to_choice: "{{choices}}"
doc_to_target: gold
metric_list:
  - metric: acc
"""
    )
with open(os.path.join(out, "mtp_gen.yaml"), "w") as f:
    f.write(
        "task: mtp_gen\n"
        + common
        + """output_type: generate_until
doc_to_text: "{{q}}"
doc_to_target: "{{choices[gold]}}"
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
"""
    )
