/* The test programs' side channel: a TCP connection to exchange their
 * QP details, and reads and writes of exactly n bytes over it. */
#ifndef RDMA_XDP_EXCHANGE_H
#define RDMA_XDP_EXCHANGE_H
#include <arpa/inet.h>
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

#endif
