"""pass@k: the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
on Code", eq. 1), from n samples per problem of which c are correct:

    pass@k = 1 - C(n - c, k) / C(n, k)

computed as 1 - prod_{i = n-c+1}^{n} (1 - k / i), which never forms a large binomial (the
numerically stable form of the paper's Figure 3). Equal to 1 when n - c < k.
"""

from __future__ import annotations

import torch


def pass_at_k(num_correct: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Per-problem unbiased pass@k.

    Args:
      num_correct: [B] int, correct samples per problem (0 <= c <= n).
      n: samples drawn per problem.
      k: 1 <= k <= n.

    Returns:
      [B] float64 in [0, 1]; average it over problems for the dataset's pass@k.
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n (got k={k}, n={n})")
    c = num_correct.to(torch.float64)
    if bool(((c < 0) | (c > n)).any()):
        raise ValueError(f"num_correct must lie in [0, n={n}]")
    i = torch.arange(1, n + 1, dtype=torch.float64)  # [n]
    # factor i contributes (1 - k/i) when i > n - c (the c largest i); 1 otherwise.
    use = i.unsqueeze(0) > (n - c).unsqueeze(1)  # [B, n]
    prod = torch.where(use, 1.0 - k / i, torch.ones_like(i)).prod(dim=1)
    return 1.0 - prod
