"""Small statistics helpers."""


def median(values):
    """The middle value of `values` (the mean of the two middle ones for an even count)."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]
