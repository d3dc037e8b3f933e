"""The residual add and the RMSNorm that reads it, as one kernel.

A Llama-style decoder layer adds the attention output to the residual stream and normalizes the sum for the MLP,
then adds the MLP output and hands the sum to the next layer, whose first act is to normalize it. In eager code
each add is its own kernel: 64 launches per Llama-3-8B decode step that move a few hundred KB each, and the norm
after each reads back what the add just wrote. `install_residual_norms(model)` gives every decoder layer whose
forward is, statement for statement, `_LAYER_TEMPLATE` a forward in which

- the attention residual add and `post_attention_layernorm` are one kernel (`add_rms_norm`);
- the MLP residual add also computes the next norm (the next layer's `input_layernorm`, after the last layer the
  decoder's final `norm`) and leaves it on that norm module, keyed by the sum tensor and its version counter.
  The norm returns it when called on exactly that tensor, unchanged; on anything else it normalizes as usual.

The sum is rounded to the dtype before the norm reads it, as the eager add does, and the norm is
`kernels.rms_norm`'s arithmetic: outputs equal the eager layer's. Only norms already running the fused kernel
(`kernels.rms_norm`) take part; anything not covered runs the eager add and the module's own norm.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
import types

import torch
import triton
import triton.language as tl
try:    # private to torch (engine/compat.py): where they are gone, no sum is fused, as if a global hook were set
    from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks
except ImportError:     # pragma: no cover - a torch without them
    _global_forward_hooks = _global_forward_pre_hooks = {None: None}

from .common import device_of, usable
from .dependent_launch import enter, launch_options
from .rms_norm import MAX_ROW, is_fused_norm, leave_ahead, rms_norm_launch_config, weighted_rms_norm

# The decoder layer forward this module reproduces. ATTENTION stands for a call passing each of the forward's
# own parameters by name (name=name) and **kwargs: what it passes is then known from the signature alone.
_LAYER_TEMPLATE = """
residual = hidden_states
hidden_states = self.input_layernorm(hidden_states)
hidden_states, _ = ATTENTION
hidden_states = residual + hidden_states
residual = hidden_states
hidden_states = self.post_attention_layernorm(hidden_states)
hidden_states = self.mlp(hidden_states)
hidden_states = residual + hidden_states
return hidden_states
"""


@triton.jit(do_not_specialize=["n_rows"])   # the token count changes every step (see rms_norm._rms_norm_kernel)
def _add_rms_norm_kernel(residual, delta, w, total, out, n_rows, n_cols, eps,
                         BLOCK_N: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr):
    enter(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_ok[None, :]
    offs = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
    r = tl.load(residual + offs, mask=mask, other=0.0).to(tl.float32)
    d = tl.load(delta + offs, mask=mask, other=0.0).to(tl.float32)
    s = (r + d).to(total.dtype.element_ty)          # the eager add: one rounding to the dtype
    tl.store(total + offs, s, mask=mask)
    res = weighted_rms_norm(s.to(tl.float32), w, cols, col_ok, n_cols, eps, total.dtype.element_ty)
    tl.store(out + offs, res.to(out.dtype.element_ty), mask=mask)


def add_rms_norm(residual: torch.Tensor, delta: torch.Tensor, norm) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual + delta, norm(residual + delta)), one kernel where `norm` runs kernels.rms_norm's RMSNorm and the
    tensors are covered; the eager add and the module's own call otherwise."""
    n = residual.shape[-1] if residual.dim() else 0
    weight = getattr(norm, "weight", None)
    if not (is_fused_norm(norm) and usable(residual) and delta.dtype == residual.dtype
            and delta.shape == residual.shape and delta.device == residual.device and residual.is_contiguous()
            and delta.is_contiguous() and 0 < n <= MAX_ROW and isinstance(weight, torch.Tensor)
            and usable(weight) and weight.shape == (n,) and weight.is_contiguous()
            and weight.device == residual.device
            and not (torch.is_grad_enabled() and (residual.requires_grad or delta.requires_grad
                                                  or weight.requires_grad))):
        total = residual + delta
        return total, norm(total)
    total = torch.empty_like(residual)
    out = torch.empty(residual.shape, dtype=torch.promote_types(weight.dtype, residual.dtype),
                      device=residual.device)
    m = residual.numel() // n
    if m:
        block_n, per_prog, num_warps = rms_norm_launch_config(n)
        with device_of(residual):
            _add_rms_norm_kernel[(triton.cdiv(m, per_prog),)](
                residual, delta, weight, total, out, m, n, float(norm.variance_epsilon), BLOCK_N=block_n,
                ROWS=per_prog, num_warps=num_warps, **launch_options(residual.device))
    return total, out


def add_norm_ahead(residual: torch.Tensor, delta: torch.Tensor, next_norm) -> torch.Tensor:
    """residual + delta, with `next_norm`'s output on it computed in the same kernel and left on the module for
    its next call on this very tensor (see rms_norm._fused_rms_norm_forward)."""
    if not is_fused_norm(next_norm) or _global_forward_hooks or _global_forward_pre_hooks:
        return residual + delta         # a global hook may change the sum before the norm reads it
    total, normed = add_rms_norm(residual, delta, next_norm)
    leave_ahead(next_norm, total, normed)
    return total


def _fused_layer_forward(self, hidden_states, *args, **kwargs):
    spec = self.batchscope_layer
    if len(args) > len(spec["positional"]) or any(name in kwargs for name in spec["positional"][:len(args)]):
        raise TypeError(f"{type(self).__name__}.forward() got too many or repeated arguments")
    for old, new in spec["renamed"]:            # the layer's deprecate_kwarg renames, which this bypasses
        if old in kwargs:
            value = kwargs.pop(old)
            kwargs.setdefault(new, value)
    passed = dict(spec["defaults"])
    passed.update(zip(spec["positional"], args))
    passed.update(kwargs)
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(hidden_states=hidden_states, **passed)
    residual, hidden_states = add_rms_norm(residual, hidden_states, self.post_attention_layernorm)
    hidden_states = self.mlp(hidden_states)
    next_layer = spec["next_layer"]
    if self._forward_hooks or (next_layer is not None and next_layer._forward_pre_hooks):
        return residual + hidden_states         # a hook between this add and the next norm may change the sum
    return add_norm_ahead(residual, hidden_states, spec["next_norm"])


def _renamed_arguments(forward) -> list[tuple[str, str]]:
    """(old, new) keyword renames of the transformers `deprecate_kwarg` wrappers around `forward`, read from
    their closures; the fused forward applies them itself."""
    renames = []
    while hasattr(forward, "__wrapped__"):
        cells = dict(zip(forward.__code__.co_freevars, (c.cell_contents for c in forward.__closure__ or ())))
        if isinstance(cells.get("old_name"), str) and isinstance(cells.get("new_name"), str):
            renames.append((cells["old_name"], cells["new_name"]))
        forward = forward.__wrapped__
    return renames


def layer_spec(layer) -> dict | None:
    """What the fused forward needs to pass the attention exactly what the layer's own forward passes: its
    parameters after hidden_states (positional order, defaults). None when the forward is not the template."""
    fn = inspect.unwrap(type(layer).forward)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        sig = inspect.signature(fn)
    except (OSError, TypeError, SyntaxError, ValueError):
        return None
    body = tree.body[0].body if isinstance(tree.body[0], ast.FunctionDef) else []
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]                 # the docstring
    template = ast.parse(_LAYER_TEMPLATE).body
    params = list(sig.parameters.values())
    if (len(body) != len(template) or [p.name for p in params[:2]] != ["self", "hidden_states"]
            or params[-1].kind is not inspect.Parameter.VAR_KEYWORD or params[-1].name != "kwargs"):
        return None
    named = [p for p in params[2:-1] if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    if len(named) != len(params) - 3:
        return None
    for got, want in zip(body, template):
        if ast.unparse(want).endswith("ATTENTION"):
            call = got.value if isinstance(got, ast.Assign) else None
            if not (isinstance(call, ast.Call) and ast.unparse(got.targets[0]) == "(hidden_states, _)"
                    and ast.unparse(call.func) == "self.self_attn" and not call.args):
                return None
            passes = {kw.arg: ast.unparse(kw.value) for kw in call.keywords}
            want_passes = {"hidden_states": "hidden_states", None: "kwargs", **{p.name: p.name for p in named}}
            if passes != want_passes:
                return None
        elif ast.dump(got) != ast.dump(want):
            return None
    return {"positional": [p.name for p in named], "next_norm": None, "next_layer": None,
            "renamed": _renamed_arguments(type(layer).forward),
            "defaults": {p.name: p.default for p in named if p.default is not inspect.Parameter.empty}}


def _no_inplace_changes(decoder) -> bool:
    """Whether the decoder's forward (which runs the layers and the final norm) never changes `hidden_states` in
    place (augmented assignment, a trailing-underscore method, item assignment): then the tensor a layer returns is
    the one its next norm reads, unchanged."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(type(decoder).forward))))
    except (OSError, TypeError, SyntaxError):
        return False
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.AugAssign):
            target = node.target
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.endswith("_") \
                and not node.func.attr.startswith("_"):
            target = node.func.value
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            target = next((t.value for t in targets if isinstance(t, ast.Subscript)), None)
        if isinstance(target, ast.Name) and target.id == "hidden_states":
            return False
    return True


def install_residual_norms(model: torch.nn.Module) -> list[str]:
    """Give each template decoder layer whose two norms are kernels.rms_norm's the fused forward; returns their
    module names. Each layer's MLP add computes the norm that follows it: the next layer's input norm, or after
    the last layer of a `layers` list, the decoder's `norm`."""
    installed: list[str] = []
    for name, decoder in model.named_modules():
        layers = getattr(decoder, "layers", None)
        if not isinstance(layers, torch.nn.ModuleList):
            continue
        if not _no_inplace_changes(decoder):
            continue
        final = getattr(decoder, "norm", None)
        specs = [layer_spec(layer) if "forward" not in layer.__dict__ and is_fused_norm(
                     getattr(layer, "input_layernorm", None)) and is_fused_norm(
                     getattr(layer, "post_attention_layernorm", None)) else None for layer in layers]
        for i, (layer, spec) in enumerate(zip(layers, specs)):
            if spec is None:
                continue
            # the norm after the MLP add: a template layer's input norm (its first act), or the decoder's final one
            if i + 1 < len(layers) and specs[i + 1] is not None:
                spec["next_layer"], spec["next_norm"] = layers[i + 1], layers[i + 1].input_layernorm
            elif i + 1 == len(layers) and isinstance(getattr(final, "weight", None), torch.Tensor):
                spec["next_norm"] = final
            layer.batchscope_layer = spec
            layer.forward = types.MethodType(_fused_layer_forward, layer)
            installed.append(f"{name}.layers.{i}" if name else f"layers.{i}")
    return installed


def uninstall_residual_norms(model: torch.nn.Module) -> None:
    for module in model.modules():
        if getattr(module.__dict__.get("forward"), "__func__", None) is _fused_layer_forward:
            del module.forward
            del module.batchscope_layer
