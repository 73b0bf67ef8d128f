"""One module per rule (or per small family of rules); each registers itself with `@register`."""
