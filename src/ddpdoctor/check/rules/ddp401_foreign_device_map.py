from __future__ import annotations

import ast
from collections.abc import Iterator

from ...findings import Finding, Fix, Severity
from ..program import accelerate_training, distributed_program, one_process_test
from ..rank_paths import enclosing_function
from ..registry import Rule, register
from ..source import SourceFile, keyword
from ..values import scope_of_calls

PLACEMENT_STRATEGIES = frozenset({"auto", "balanced", "balanced_low_0", "sequential"})
QUANTIZATION = ("load_in_8bit", "load_in_4bit", "quantization_config")


@register
class ForeignDeviceMap(Rule):
    """
    ## What it does
    Finds `from_pretrained(..., device_map="auto")` (or `"balanced"`, `"balanced_low_0"`, `"sequential"`,
    `"cuda:0"`) in a file that trains with DDP (a Lightning `ddp` strategy, `DDPStrategy`,
    `DistributedDataParallel`, `init_process_group`), or in any file of a program that another of its files
    shows to be distributed training (`deepspeed.initialize`, a Hugging Face `Trainer` / `TrainingArguments`,
    a TRL trainer, DDP, FSDP, a Lightning strategy): the helper module that loads the model included; or in
    a file that trains under accelerate (its multi-process API, `accelerator.backward`, and
    `accelerator.prepare(model, optimizer, ...)`: `accelerate launch` on several GPUs wraps the model in DDP
    there, and accelerate then refuses a model loaded with `device_map`). An `Accelerator` alone or an
    `init_process_group` in another file is not enough: both serve single-process and inference programs
    too. 8-bit/4-bit loading through such a device map is named in
    the message.

    What it follows: the value of `device_map` through the names it is bound to, on every path, in a
    distributed run (the value-flow core, `check/values.py`): `device_map = "auto"` in a branch that some
    runs take is reported; `device_map = "auto"` replaced under `if ddp:` (`ddp = world_size != 1`), or
    `{"": local_rank} if ddp else "auto"`, is not, since a distributed run takes the other side. A
    `device_map` given through a spread dict (`options["device_map"] = "auto"` or a dict literal's key, then
    `from_pretrained(..., **options)` in the same function) is read at the last such assignment before the
    call. A value bound in an `except` counts where a distributed run can reach it: not after `try: device
    = torch.device("cuda", local_rank)`, which raises only for the negative index of a run no launcher
    started. A value the checker cannot read (a configuration lookup) is not reported.

    ## Why is this bad?
    `device_map` hands placement to accelerate: it registers hooks (`AlignDeviceHook`) that move weights
    and inputs to the devices *it* chose, usually starting at `cuda:0` on every rank. DDP (or the Lightning
    strategy) put the model on `cuda:<local_rank>`. With two owners of placement, rank 1 fails in forward
    with `Expected all tensors to be on the same device, but found at least two devices, cuda:1 and
    cuda:0!`, and bitsandbytes' 8-bit layers make it worse.

    ## Known problems
    A program is distributed by its markers; a script launched by `torchrun` that shows none of them (its
    process group made by a library the checker does not know) is not checked. A `device_map` read from
    configuration is not followed. A `test_*` function of a pytest module is taken to run in pytest's one
    process unless the module shows something that starts more (a group of its own, `spawn`, a `torchrun`
    or `launch` command, a `Distributed`/`MultiProcess` harness, `world_size`): a test that a harness
    defined elsewhere runs on several processes is not checked.

    ## Example
    ```python
    model = AutoModelForCausalLM.from_pretrained(name, device_map="auto", load_in_8bit=True)
    trainer = Trainer(strategy="ddp", devices=4)
    ```

    ## Use instead
    ```python
    model = AutoModelForCausalLM.from_pretrained(name, device_map={"": local_rank}, load_in_8bit=True)
    trainer = Trainer(strategy="ddp", devices=4)
    ```
    (one device per rank; or no `device_map` and let the strategy place the model).

    ## Fix safety
    No automatic fix: the rank's device is known only at run time.

    ## References
    - <https://huggingface.co/docs/accelerate/usage_guides/big_modeling>
    - <https://huggingface.co/docs/transformers/quantization/bitsandbytes>
    - <https://github.com/Lightning-AI/pytorch-lightning/issues/20276>
    """

    code = "DDP401"
    name = "foreign-device-map"
    class_slug = "foreign-device-hooks"
    severity = Severity.ERROR
    summary = "`from_pretrained(device_map=auto/balanced/...)` in DDP-trained code"
    triggers = ("device_map",)

    project_wide = True  # whether the program is distributed may show in another of its files
    asks_program = True

    def check(self, source: SourceFile) -> Iterator[Finding]:
        if not (distributed_program(source) or accelerate_training(source)):
            return
        values = scope_of_calls(source)
        for call in source.calls:
            if not (isinstance(call.func, ast.Attribute) and call.func.attr == "from_pretrained"):
                continue
            device_map = keyword(call, "device_map") or _through_kwargs(source, call)
            if device_map is None or one_process_test(source, enclosing_function(source, call)):
                continue
            held = values(device_map.value).constants(device_map.value, device_map.value)
            foreign = sorted(str(v) for v in held.values if isinstance(v, str) and _foreign(v))
            if not foreign:
                continue
            quantized = [name for name in QUANTIZATION if keyword(call, name) is not None]
            extra = f" with {', '.join(f'`{q}`' for q in quantized)}" if quantized else ""
            value = source.segment(device_map.value)
            may = ", ".join(repr(v) for v in foreign)
            shown = f"`device_map={value}`" if isinstance(device_map.value, ast.Constant) else (
                f"`device_map={value}` (it may be {may} in a distributed run)")
            yield self.finding(
                source, device_map,
                f"{shown}{extra} lets accelerate place (and hook) the weights on devices of its "
                "choosing, while DDP puts each rank's model on its own GPU: two owners of device placement",
                fix=Fix(message='one device per rank: `device_map={"": local_rank}`, or no device_map'),
            )


def _through_kwargs(source: SourceFile, call: ast.Call) -> ast.keyword | None:
    """`kwargs["device_map"] = "auto"` (or `kwargs = {"device_map": ...}`) in the function that then calls
    `from_pretrained(..., **kwargs)`: the value given, as a keyword made of it (the last one written
    before the call, in source order; the value core reads its bindings where it is written)."""
    spread = [k.value.id for k in call.keywords if k.arg is None and isinstance(k.value, ast.Name)]
    if not spread:
        return None
    scope: ast.AST = enclosing_function(source, call) or source.tree
    found: ast.Assign | None = None
    value: ast.expr | None = None
    for node in ast.walk(scope):
        if not isinstance(node, ast.Assign) or node.lineno > call.lineno or (
                found is not None and node.lineno < found.lineno):
            continue  # ast.walk goes breadth first: the latest line before the call wins, not the last seen
        for target in node.targets:
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and (
                    target.value.id in spread) and isinstance(target.slice, ast.Constant) and (
                    target.slice.value == "device_map"):
                found, value = node, node.value
            elif isinstance(target, ast.Name) and target.id in spread and isinstance(node.value, ast.Dict):
                given = next((v for k, v in zip(node.value.keys, node.value.values, strict=True)
                              if isinstance(k, ast.Constant) and k.value == "device_map"), None)
                if given is not None:
                    found, value = node, given
    return ast.copy_location(ast.keyword(arg="device_map", value=value), value) if value is not None else None


def _foreign(value: str) -> bool:
    return value in PLACEMENT_STRATEGIES or value.startswith("cuda:")
