"""The eager reference a placed training step is checked against (tests and the GPU check share it)."""

from __future__ import annotations


def eager_sgd_losses(model, inputs, loss_fn, steps: int) -> list[float]:
    """Loss per step of the plain model under torch.optim.SGD (lr 0.1, momentum 0.9: the traced optimizer).

    The seed is reset before every step so dropout draws the same masks as the placed run."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(steps):
        torch.manual_seed(123)
        opt.zero_grad()
        loss = loss_fn(model(*inputs))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
