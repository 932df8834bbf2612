"""The pure resolver: question + snapshot + config -> answer."""
