"""Reading a transformers model's own source: whether its decoder only looks its input ids up (so the runner may do
the lookup), and what its causal-LM head does to the logits (so the runner can reproduce it, or the model is
refused)."""
from __future__ import annotations

import ast
import inspect
import re
import textwrap

import torch


def embeds_only(decoder) -> bool:
    """Whether `decoder.forward` uses `input_ids` for nothing but `inputs_embeds = self.embed_tokens(input_ids)`
    (and checks against None), so that passing embeddings the caller looked up with `decoder.embed_tokens`
    computes the same thing. Models that scale the lookup or derive more from the ids (per-layer inputs) do not."""
    if not isinstance(getattr(decoder, "embed_tokens", None), torch.nn.Module):
        return False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(type(decoder).forward)))
    except (OSError, TypeError, SyntaxError):
        return False
    fn = tree.body[0]
    if not isinstance(fn, ast.FunctionDef):
        return False
    allowed: set[int] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Compare) and len(node.comparators) == 1 and \
                isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value is None:
            allowed.add(id(node.left))
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords and \
                ast.unparse(value.func) == "self.embed_tokens" and \
                [ast.unparse(t) for t in targets if t is not None] == ["inputs_embeds"]:
            allowed.add(id(value.args[0]))
    uses = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == "input_ids"]
    return bool(uses) and all(id(n) in allowed for n in uses)


# --------------------------------------------------------------------------------------------------------------
# The *ForCausalLM head: the runner calls the decoder and `lm_head` itself (on the sampled rows only), so whatever
# the model's own forward does between them, and to the logits after, must be reproduced or the model refused.
# --------------------------------------------------------------------------------------------------------------
class UnsupportedHead(ValueError):
    """The causal-LM forward does something around its lm_head that the runner does not reproduce."""


# hidden states may only be taken from the decoder output and sliced to the rows that are kept
_HIDDEN_SOURCES = re.compile(r"^(\w*outputs(\.last_hidden_state|\[0\])|"
                             r"slice_logits_to_keep\(hidden_states, logits_to_keep\))$")
_HEAD_INPUTS = {"hidden_states", "hidden_states[:, slice_indices, :]"}
_LOGIT_CALLS = {"torch.tanh"}        # functions a logits step may call
_LOGIT_METHODS = {"float"}           # methods of `logits` a step may call


def _check_expr(node: ast.AST, names: set[str]) -> None:
    """Elementwise arithmetic on `logits` with constants read from the model or its config, nothing else."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id not in names:
            raise UnsupportedHead(f"reads {n.id!r}")
        if isinstance(n, ast.Call):
            func = ast.unparse(n.func)
            method = isinstance(n.func, ast.Attribute) and ast.unparse(n.func.value) == "logits"
            if not (func in _LOGIT_CALLS or (method and n.func.attr in _LOGIT_METHODS and not n.args)) or n.keywords:
                raise UnsupportedHead(f"calls {func}")
        elif not isinstance(n, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Name, ast.Attribute, ast.Constant,
                                ast.Load, ast.operator, ast.unaryop, ast.Compare, ast.cmpop, ast.BoolOp,
                                ast.boolop)):
            raise UnsupportedHead(f"uses {type(n).__name__}")
        if isinstance(n, ast.BinOp) and not isinstance(n.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            raise UnsupportedHead(f"uses the operator {type(n.op).__name__}")


def logits_epilogue(model) -> list:
    """The steps the model's causal-LM forward applies to the logits after `lm_head` (Gemma 2's final
    soft-capping, Granite's logits_scaling, Cohere's logit_scale), as callables logits -> logits, in order.
    They are the model's own expressions, compiled: the result is what `model.forward` computes. `if` guards
    around them (`if self.config.final_logit_softcapping is not None`) are evaluated once, here.
    Raises UnsupportedHead when the forward does anything else between the decoder and the logits."""
    return _read_head(type(model), {"self": model, "torch": torch})


def check_head(cls) -> None:
    """The same reading from the class alone, before any weight is loaded: raises UnsupportedHead where the form of
    the forward is not one batchscope reproduces, whatever the guards come to."""
    _read_head(cls, None)


def _read_head(cls, env: dict | None) -> list:
    """The logits steps of `cls.forward` (with `env` to evaluate its guards; None: check the form only)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls.forward)))
    except (OSError, TypeError, SyntaxError) as exc:
        raise UnsupportedHead(f"cannot be read as source ({exc})") from None
    fn = tree.body[0]
    steps: list = []
    head_seen = False

    def guard_holds(tests) -> bool:
        for test in tests:
            _check_expr(ast.Expression(test), {"self", "torch"})
        for test in tests if env is not None else ():
            if not eval(compile(ast.Expression(test), "<guard>", "eval"), {"__builtins__": {}}, env):
                return False
        return True

    def visit(stmts, guards):
        nonlocal head_seen
        for st in stmts:
            if isinstance(st, ast.If):
                visit(st.body, guards + [st.test])
                visit(st.orelse, guards + [ast.UnaryOp(ast.Not(), st.test)])
                continue
            if isinstance(st, (ast.For, ast.While, ast.With, ast.Try)):
                touched = {n.id for n in ast.walk(st) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                if touched & {"logits", "hidden_states"}:
                    raise UnsupportedHead("computes its logits inside a loop, with or try block")
                continue
            if not isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                continue
            targets = st.targets if isinstance(st, ast.Assign) else [st.target]
            names = {ast.unparse(t) for t in targets}
            if "hidden_states" in names:
                if isinstance(st, ast.AugAssign) or not _HIDDEN_SOURCES.match(ast.unparse(st.value)):
                    raise UnsupportedHead(f"changes its hidden states before the lm_head: {ast.unparse(st)}")
            if "logits" not in names:
                continue
            if len(names) != 1 or isinstance(st, ast.AugAssign):
                raise UnsupportedHead(f"assigns its logits in a form not reproduced: {ast.unparse(st)}")
            value = st.value
            if isinstance(value, ast.Call) and ast.unparse(value.func) == "self.lm_head":
                if head_seen or guards or [ast.unparse(a) for a in value.args] not in [[s] for s in _HEAD_INPUTS]:
                    raise UnsupportedHead(f"calls its lm_head in a form not reproduced: {ast.unparse(st)}")
                head_seen = True
                continue
            if not head_seen:
                raise UnsupportedHead(f"computes logits before its lm_head: {ast.unparse(st)}")
            _check_expr(ast.Expression(value), {"logits", "self", "torch"})
            if guard_holds(guards) and env is not None:
                code = compile(ast.Expression(value), f"<{cls.__name__} logits>", "eval")
                steps.append(lambda logits, code=code: eval(code, {"__builtins__": {}}, {**env, "logits": logits}))

    visit(fn.body, [])
    if not head_seen:
        raise UnsupportedHead("has no `logits = self.lm_head(hidden_states)`, the form batchscope reproduces")
    return steps
