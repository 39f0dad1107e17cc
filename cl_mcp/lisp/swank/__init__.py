"""The Swank (SLIME protocol) client: wire format and asyncio connection."""
