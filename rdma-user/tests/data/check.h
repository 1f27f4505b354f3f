/* The test programs' check: prints "ok NAME", or "FAIL NAME: ..." and
 * exits 1 at the first that fails (the test then shows everything up to
 * it). */
#ifndef RDMA_XDP_CHECK_H
#define RDMA_XDP_CHECK_H
#include <stdio.h>
#include <stdlib.h>

#define CHECK(name, cond, ...)                                   \
	do {                                                     \
		if (cond) {                                      \
			printf("ok %s\n", name);                 \
			fflush(stdout);                          \
		} else {                                         \
			printf("FAIL %s: ", name);               \
			printf(__VA_ARGS__);                     \
			printf("\n");                            \
			exit(1);                                 \
		}                                                \
	} while (0)

#endif
