"""A local generation engine on Hugging Face transformers, for the embedded default (CPU, or
one GPU when there is one): async, with continuous batching over a shared KV cache.

Requests join the running batch as soon as they arrive (their prompt is pre-filled, then
their cache rows are left-padded into the batch) and leave it when they stop, so the engine
decodes one token for every active sequence per step instead of serving one request at a
time. Same token-in/token-out interface as the vLLM engine: `generate(request_id,
prompt_ids, sampling_params) -> Generation`.

Log-probs and entropies are those of the distribution actually sampled from (after
temperature, before top-p truncation).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from dataclasses import dataclass, field

import torch

from rstar.agent.loop import Generation


@dataclass
class _Seq:
    prompt_ids: list[int]
    params: dict
    future: asyncio.Future
    generator: torch.Generator
    out: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    length: int = 0  # real tokens in the cache (prompt + generated so far, minus the pending one)
    next_token: int = -1  # sampled, not yet fed to the model
    stop_reason: str = "stop"


def _pad_left(t: torch.Tensor, to: int) -> torch.Tensor:
    return t if t.shape[2] == to else torch.nn.functional.pad(t, (0, 0, to - t.shape[2], 0))


class HFEngine:
    def __init__(
        self, model, *, max_batch: int = 64, seed: int = 0, max_model_len: int | None = None
    ) -> None:
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.max_batch = max_batch
        self.seed = seed
        self.max_model_len = max_model_len or getattr(model.config, "max_position_embeddings", 4096)
        self._waiting: list[_Seq] = []
        self._active: list[_Seq] = []
        self._cache = None  # per layer (keys, values), [batch, heads, width, dim], left-padded
        self._width = 0  # cache positions, padding included
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._lock = threading.Lock()  # weights may be swapped between steps (RL updates)
        self.steps = 0
        self.tokens_generated = 0

    @property
    def kv_capacity_tokens(self) -> int:
        """What the cache may hold: `max_batch` sequences of at most `max_model_len` tokens."""
        return self.max_batch * self.max_model_len

    @classmethod
    def from_pretrained(cls, path: str, **kw) -> HFEngine:
        from transformers import AutoModelForCausalLM

        device = "cuda" if torch.cuda.is_available() else "cpu"
        return cls(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device), **kw)

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: dict
    ) -> Generation:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        g = torch.Generator(device="cpu")
        g.manual_seed(
            int.from_bytes(
                hashlib.sha256(f"{self.seed}/{request_id}".encode()).digest()[:8], "little"
            )
        )
        seq = _Seq(
            list(prompt_ids), dict(sampling_params), asyncio.get_running_loop().create_future(), g
        )
        self._waiting.append(seq)
        self._wake.set()
        return await seq.future

    def load_state_dict(self, state: dict) -> None:
        """New policy weights, applied between decoding steps."""
        with self._lock:
            self.model.load_state_dict(state)

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # -- the batching loop --------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            if not self._waiting and not self._active:
                self._wake.clear()
                await self._wake.wait()
            joining = self._waiting[: self.max_batch - len(self._active)]
            del self._waiting[: len(joining)]
            finished = await asyncio.to_thread(self._step, joining)
            for seq in finished:
                if not seq.future.done():
                    seq.future.set_result(
                        Generation(seq.out, seq.log_probs, seq.entropies, seq.stop_reason)
                    )

    @torch.no_grad()
    def _step(self, joining: list[_Seq]) -> list[_Seq]:
        with self._lock:
            if joining:
                self._prefill(joining)
            done = self._retire()  # a first token can already end a request
            if not self._active:
                return done
            ids = torch.tensor([[s.next_token] for s in self._active], device=self.device)
            positions = torch.tensor([[s.length] for s in self._active], device=self.device)
            mask = self._attention_mask(extra=1)
            out = self.model(
                input_ids=ids,
                position_ids=positions,
                attention_mask=mask,
                past_key_values=self._as_cache(),
                use_cache=True,
            )
            self._keep_cache(out.past_key_values)
            self._width += 1
            for s in self._active:
                s.length += 1
            self._sample_all(self._active, out.logits[:, -1, :])
            self.steps += 1
            return done + self._retire()

    def _prefill(self, seqs: list[_Seq]) -> None:
        """Pre-fill the joining requests in one forward pass, left-padded as the running batch
        is (one pass per request cost as much as all the decoding: a later turn's prompt holds
        the whole conversation so far)."""
        longest = max(len(s.prompt_ids) for s in seqs)
        ids = torch.zeros(len(seqs), longest, dtype=torch.long, device=self.device)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(seqs):
            ids[i, longest - len(s.prompt_ids) :] = torch.tensor(s.prompt_ids, device=self.device)
            mask[i, longest - len(s.prompt_ids) :] = 1
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
        )
        layers = self._layers(out.past_key_values)
        width = max(self._width, longest)
        if self._cache is None:
            self._cache = layers
        else:
            self._cache = [
                (
                    torch.cat([_pad_left(k0, width), _pad_left(k1, width)]),
                    torch.cat([_pad_left(v0, width), _pad_left(v1, width)]),
                )
                for (k0, v0), (k1, v1) in zip(self._cache, layers)
            ]
        self._width = width
        for s in seqs:
            s.length = len(s.prompt_ids)
            self._active.append(s)
        self._sample_all(seqs, out.logits[:, -1, :])

    def _attention_mask(self, extra: int) -> torch.Tensor:
        mask = torch.zeros(
            len(self._active), self._width + extra, dtype=torch.long, device=self.device
        )
        for i, s in enumerate(self._active):
            mask[i, self._width - s.length :] = 1
        return mask

    @staticmethod
    def _layers(cache):
        return [(layer.keys, layer.values) for layer in cache.layers]

    def _as_cache(self):
        from transformers import DynamicCache

        cache = DynamicCache()
        for i, (k, v) in enumerate(self._cache):
            cache.update(k, v, i)
        return cache

    def _keep_cache(self, cache) -> None:
        self._cache = self._layers(cache)

    def _sample_all(self, seqs: list[_Seq], logits: torch.Tensor) -> None:
        """One token for each of `seqs` (rows of `logits`): the distributions of the whole batch at
        once, then each draw from its request's own generator (its tokens do not depend on its
        batch)."""
        temps = torch.tensor([float(s.params.get("temperature", 1.0)) for s in seqs])
        logits = logits.float().cpu()
        logp = torch.log_softmax(logits / torch.where(temps > 0, temps, 1.0)[:, None], -1)
        probs = logp.exp()
        entropies = (-(probs * logp).sum(-1)).tolist()
        for i, seq in enumerate(seqs):
            if temps[i] <= 0:  # greedy
                token = int(torch.argmax(logits[i]))
            else:
                p = probs[i]
                top_p = float(seq.params.get("top_p", 1.0))
                if top_p < 1.0:
                    sorted_p, order = torch.sort(p, descending=True)
                    keep = torch.cumsum(sorted_p, 0) - sorted_p < top_p
                    p = torch.zeros_like(p).scatter(0, order[keep], sorted_p[keep])
                token = int(torch.multinomial(p, 1, generator=seq.generator))
            seq.out.append(token)
            seq.log_probs.append(float(logp[i, token]))
            seq.entropies.append(entropies[i])
            seq.next_token = token
        self.tokens_generated += len(seqs)

    def _retire(self) -> list[_Seq]:
        done, keep = [], []
        for i, s in enumerate(self._active):
            stop_ids = s.params.get("stop_token_ids") or []
            max_tokens = int(s.params.get("max_tokens", 256))
            if s.out[-1] in stop_ids:
                done.append(s)
            elif len(s.out) >= max_tokens or s.length + 1 >= self.max_model_len:
                s.stop_reason = "length"
                done.append(s)
            else:
                keep.append(i)
        if done:
            self._active = [self._active[i] for i in keep]
            if not self._active:
                self._cache, self._width = None, 0
            else:
                idx = torch.tensor(keep, device=self.device)
                # drop columns that are padding for all
                trim = self._width - max(s.length for s in self._active)
                self._cache = [
                    (k.index_select(0, idx)[:, :, trim:], v.index_select(0, idx)[:, :, trim:])
                    for k, v in self._cache
                ]
                self._width -= trim
        return done
