"""Whether packed answers can be trusted: the reply schema's enforcement (trust), the
shadow guard's plain-call checks, and ``vote=True``'s two orders."""
