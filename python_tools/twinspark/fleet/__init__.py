"""Several pairs behind one router: `rules` (which pairs an inventory holds, what is wrong with them as a fleet),
`router_config` (the router's flags and unit), `router_launch` (the launcher, key check and front the router role
copies to the router host: standard library only), `router_client` (the router's HTTP client and its view of its
pairs) and `drain` (a pair leaves the router before it is touched). docs/FLEET.md says how they fit.
"""
