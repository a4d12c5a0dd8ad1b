"""verl's constant learning-rate schedule warms up as the local trainer's does: from
1/warmup_steps, not from 0.

Loaded in every verl process through `VERL_USE_EXTERNAL_MODULES` (`verl_launcher.verl_env`).
verl 0.9.1's `get_constant_schedule_with_warmup` gives update k the share k / warmup_steps, so
every RL stage's first update ran at rate 0: a step of 512 prompts x 32 rollouts sampled and
scored, then thrown away (for the 14B recipe, about 20 minutes of 64 GPUs a stage). verl builds
the schedule by name at the time it builds the optimizer, so replacing the function here is
enough; its cosine schedule (SFT) is untouched.
"""

from __future__ import annotations

import verl.utils.torch_functional as torch_functional
from torch.optim.lr_scheduler import LambdaLR

from rstar.train.config import warmup_share


def get_constant_schedule_with_warmup(optimizer, num_warmup_steps: int, last_epoch: int = -1):
    return LambdaLR(optimizer, lambda update: warmup_share(update, num_warmup_steps), last_epoch)


torch_functional.get_constant_schedule_with_warmup = get_constant_schedule_with_warmup
