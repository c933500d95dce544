"""Reward functions of the arithmetic task (referenced from rl.toml as `examples/arithmetic/reward.py:...`)."""


def correct(completion: str, answer: str) -> float:
    """1.0 when the model's answer is exactly the number, else 0.0."""
    return float(completion.strip() == answer)


def formatted(completion: str) -> dict[str, float]:
    """Logged, not trained on (weight 0): did the model answer with digits only?"""
    text = completion.strip()
    return {"score": float(text.lstrip("-").isdigit()), "length": float(len(text))}
