/*
 * host/plugin_api.h — the bootstrap struct and the services table the host
 * hands plugins (plugin_api.c): the first to the loader, which initialises
 * each library with it, the second to every instance's create().
 */
#ifndef KILN_HOST_PLUGIN_API_H
#define KILN_HOST_PLUGIN_API_H

#include "kiln/plugin.h"

const kiln_host_base *hs_host_base(void);
const kiln_host_services *hs_services(void);

#endif
