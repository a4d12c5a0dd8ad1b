"""A local generation engine on Hugging Face transformers, for the embedded default (CPU, or
one GPU when there is one): async, with continuous batching over a shared KV cache.

Requests join the running batch as soon as they arrive (their prompt is pre-filled, then
their cache rows are left-padded into the batch) and leave it when they stop, so the engine
decodes one token for every active sequence per step instead of serving one request at a
time. Same token-in/token-out interface as the vLLM engine: `generate(request_id,
prompt_ids, sampling_params) -> Generation`.

Log-probs and entropies are those of the distribution actually sampled from (after
temperature, before top-p truncation). Each request draws its tokens from its own random
stream, seeded by the engine's seed and the request id, so what it samples does not depend on
which other requests share its batch.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, DynamicLayer

from rstar.agent.loop import Generation


@dataclass
class _Seq:
    prompt_ids: list[int]
    params: dict
    future: asyncio.Future
    rng: random.Random
    out: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    length: int = 0  # real tokens in the cache (prompt + generated so far, minus the pending one)
    next_token: int = -1  # sampled, not yet fed to the model
    stop_reason: str = "stop"


ROOM = 256  # decoding steps a cache layer grows by: a copy of the cache once per ROOM steps


class _GrowingLayer(DynamicLayer):
    """One layer's keys and values in a buffer with room to grow: a decoding step writes its
    column in place, where DynamicLayer copies the whole cache (torch.cat) at every step."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.lazy_initialization(keys, values)
        # the tensors as they are, not a copy: the first decoding step makes room
        self.keys, self.values = self._k, self._v = keys, values

    def update(self, keys, values, *args, **kwargs):
        n, end = self.keys.shape[2], self.keys.shape[2] + keys.shape[2]
        if end > self._k.shape[2]:  # room for ROOM more steps, keeping what is there
            shape = (*keys.shape[:2], end + ROOM, keys.shape[3])
            self._k, self._v = (
                torch.cat([old[:, :, :n], old.new_empty(shape)[:, :, n:]], dim=2)
                for old in (self._k, self._v)
            )
        self._k[:, :, n:end] = keys
        self._v[:, :, n:end] = values
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values


def _pad_left(t: torch.Tensor, to: int) -> torch.Tensor:
    return t if t.shape[2] == to else torch.nn.functional.pad(t, (0, 0, to - t.shape[2], 0))


def sample(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A token per row of `logits` [batch, vocab]: row i's distribution at `temperature[i]`
    (<= 0: greedy), truncated to its `top_p[i]` nucleus, sampled by inverting its CDF at the
    uniform number `u[i]`. Returns the tokens, their log-probs and the rows' entropies, both
    under the tempered distribution before truncation."""
    greedy = temperature <= 0
    logits = logits.float().cpu()
    logp = torch.log_softmax(logits / torch.where(greedy, 1.0, temperature)[:, None], -1)
    probs = logp.exp()
    entropies = -(probs * logp).sum(-1)
    order = None
    if bool((top_p < 1.0).any()):  # keep the most likely tokens until their mass reaches top_p
        probs, order = probs.sort(-1, descending=True)
        outside = (probs.cumsum(-1) - probs >= top_p[:, None]) & (top_p[:, None] < 1.0)
        probs = probs.masked_fill(outside, 0.0)
    cdf = probs.cumsum(-1)
    picks = torch.searchsorted(cdf, u[:, None].to(cdf.dtype) * cdf[:, -1:], right=True)
    picks = picks.clamp(max=cdf.shape[-1] - 1)  # u * total may round up to the total
    tokens = (picks if order is None else order.gather(-1, picks)).squeeze(-1)
    tokens = torch.where(greedy, logits.argmax(-1), tokens)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1), entropies


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
        self._cache: Cache | None = None  # [batch, heads, width, dim] per layer, left-padded
        self._width = 0  # cache positions, padding included
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        # Every step runs on this one thread: torch gives each calling thread its own OpenMP
        # team, and asyncio's default executor hands steps to whichever of its threads is free,
        # so idle teams spun on the cores the running one needed (decoding 1.6x slower).
        self._thread: ThreadPoolExecutor | None = None
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
            self._thread = self._thread or ThreadPoolExecutor(1, thread_name_prefix="hf-engine")
            self._wake = asyncio.Event()  # of the running event loop
            self._task = asyncio.create_task(self._run())
        rng = random.Random(hashlib.sha256(f"{self.seed}/{request_id}".encode()).digest())
        seq = _Seq(
            list(prompt_ids), dict(sampling_params), asyncio.get_running_loop().create_future(), rng
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
        if self._thread:
            self._thread.shutdown()
            self._thread = None

    # -- the batching loop --------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            if not self._waiting and not self._active:
                self._wake.clear()
                await self._wake.wait()
            joining = self._waiting[: self.max_batch - len(self._active)]
            del self._waiting[: len(joining)]
            finished = await asyncio.get_running_loop().run_in_executor(
                self._thread, self._step, joining
            )
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
            lengths = torch.tensor([s.length for s in self._active], device=self.device)
            # left-padded: a row's real tokens are the last `length` cache columns, plus the new one
            columns = torch.arange(self._width + 1, device=self.device)
            out = self.model(
                input_ids=ids,
                position_ids=lengths[:, None],
                attention_mask=(columns >= self._width - lengths[:, None]).long(),
                past_key_values=self._cache,  # grows in place
                use_cache=True,
            )
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
            # the output head on the last position only: on every position, a real vocabulary's
            # logits were requests x longest prompt x 49K floats (21 GB for 128 mining rollouts)
            logits_to_keep=1,
        )
        new = out.past_key_values.layers  # each freed as it joins the batch
        width = max(self._width, longest)

        def joined(i: int, keys: torch.Tensor, values: torch.Tensor):
            layer, new[i] = new[i], None
            return (
                torch.cat([_pad_left(keys, width), _pad_left(layer.keys, width)]),
                torch.cat([_pad_left(values, width), _pad_left(layer.values, width)]),
            )

        if self._cache is None:
            self._cache = Cache(layers=[_GrowingLayer(layer.keys, layer.values) for layer in new])
        else:
            self._rebuild(joined)
        self._width = width
        for s in seqs:
            s.length = len(s.prompt_ids)
            self._active.append(s)
        self._sample_all(seqs, out.logits[:, -1, :])

    def _rebuild(self, make) -> None:
        """Each cache layer replaced by `make(index, keys, values)`, one layer at a time, so that
        the cache exists twice over for one layer at most (rebuilt whole, it was held three
        times over: old, new and a copy with room to grow)."""
        layers = self._cache.layers
        for i, layer in enumerate(layers):
            layers[i] = _GrowingLayer(*make(i, layer.keys, layer.values))

    def _sample_all(self, seqs: list[_Seq], logits: torch.Tensor) -> None:
        """One token for each of `seqs` (rows of `logits`), the whole batch at once."""
        tokens, log_probs, entropies = sample(
            logits,
            torch.tensor([float(s.params.get("temperature", 1.0)) for s in seqs]),
            torch.tensor([float(s.params.get("top_p", 1.0)) for s in seqs]),
            torch.tensor([s.rng.random() for s in seqs]),
        )
        for seq, token, lp, ent in zip(
            seqs, tokens.tolist(), log_probs.tolist(), entropies.tolist()
        ):
            seq.out.append(token)
            seq.log_probs.append(lp)
            seq.entropies.append(ent)
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
                self._rebuild(
                    lambda i, k, v: (
                        k[:, :, trim:].index_select(0, idx),
                        v[:, :, trim:].index_select(0, idx),
                    )
                )
                self._width -= trim
        return done
