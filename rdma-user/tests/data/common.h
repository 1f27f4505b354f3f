/* What the two-process test programs share: a TCP connection to exchange
 * their QP details (reads and writes of exactly n bytes over it), opening
 * a device by name, and waiting for a completion. */
#ifndef RDMA_XDP_COMMON_H
#define RDMA_XDP_COMMON_H
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"

static void xfer(int fd, void *p, size_t n, int out)
{
	char *c = p;
	while (n) {
		ssize_t k = out ? write(fd, c, n) : read(fd, c, n);
		CHECK("exchange", k > 0, "errno %d", errno);
		c += k;
		n -= k;
	}
}

/* The server (peer NULL) accepts one connection on port; a client
 * connects to peer:port, retrying for 10 s. */
static int tcp(const char *peer, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (!peer) {
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		CHECK("listen", bind(fd, (void *)&a, sizeof a) == 0 && listen(fd, 1) == 0, "errno %d", errno);
		int c = accept(fd, NULL, NULL);
		close(fd);
		return c;
	}
	inet_pton(AF_INET, peer, &a.sin_addr);
	for (int i = 0; i < 100; i++) {
		if (connect(fd, (void *)&a, sizeof a) == 0)
			return fd;
		usleep(100000);
	}
	CHECK("connect", 0, "errno %d", errno);
	return -1;
}

/* The device named `name`, opened. */
static struct ibv_context *open_named(const char *name)
{
	int num;
	struct ibv_context *c = NULL;
	struct ibv_device **list = ibv_get_device_list(&num);
	for (int i = 0; list && i < num; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			c = ibv_open_device(list[i]);
	CHECK("open", c != NULL, "no device %s", name);
	return c;
}

/* The next completion of `cq`, polled for at most 20 s. */
static struct ibv_wc wait_wc_on(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	time_t end = time(NULL) + 20;
	while (time(NULL) < end)
		if (ibv_poll_cq(cq, 1, &wc) == 1)
			return wc;
	CHECK("a completion", 0, "none in 20 s");
	return wc;
}

#endif
