/* Memory kinds, access flags, iova registration, solicited-only events and
 * asynchronous events, against the drop-in libibverbs, between two
 * processes (two hosts). Built by tests/ibverbs_abi.rs with Debian's
 * libibverbs-dev headers and run with LD_LIBRARY_PATH on our library.
 *
 * usage: features target PORT DEVICE NETDEV
 *        features initiator PEER_IPV4 PORT DEVICE NETDEV
 *
 * The target registers one region of each kind of memory (heap, memalign,
 * mmap, stack, 2 MiB huge page, iova-addressed) filled with a pattern, and
 * one read-only region. The initiator READs each region and checks the
 * pattern, WRITEs a new one into its second half (its own buffers are of
 * the same kinds), and finally SENDs: without and then with the solicited
 * bit while the target waits armed solicited-only. A WRITE to the
 * read-only region must fail with REM_ACCESS_ERR and raise QP_FATAL on the
 * initiator. The target checks what was written, then its port goes down
 * and up (NETDEV), which must raise PORT_ERR and PORT_ACTIVE.
 *
 * Prints "ok NAME" per check; "FAIL NAME ..." and exit 1 on the first
 * that fails. */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "common.h"

enum { KINDS = 6, LEN = 65536, HUGE = 2 << 20, IOVA = 0x40000000 };
static const char *kind_name[KINDS] = { "heap", "memalign", "mmap", "stack", "hugepage", "iova" };

struct region {
	uint64_t addr; /* what the peer addresses: the VA, or the iova */
	uint32_t rkey;
};

struct hello {
	uint32_t qpn, psn;
	uint8_t gid[16];
	struct region r[KINDS], ro;
};

/* Six buffers of LEN bytes, one of each kind; `stack` is the caller's. */
static void buffers(char **b, char *stack)
{
	b[0] = malloc(LEN);
	CHECK("memalign", posix_memalign((void **)&b[1], 4096, LEN) == 0, "failed");
	b[2] = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK("mmap", b[2] != MAP_FAILED, "errno %d", errno);
	b[3] = stack;
	b[4] = mmap(NULL, HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
	CHECK("mmap MAP_HUGETLB (a 2 MiB huge page)", b[4] != MAP_FAILED, "errno %d", errno);
	b[5] = malloc(LEN);
	CHECK("malloc", b[0] && b[5], "failed");
}

static struct ibv_mr *reg(struct ibv_pd *pd, char *buf, int kind, int access)
{
	struct ibv_mr *mr = kind == 5 ? ibv_reg_mr_iova2(pd, buf, LEN, IOVA, access)
				      : ibv_reg_mr(pd, buf, LEN, access);
	printf("reg_mr %s: %s\n", kind_name[kind], mr ? "registered" : strerror(errno));
	CHECK("reg_mr", mr != NULL, "%s: errno %d", kind_name[kind], errno);
	return mr;
}

/* An SGE over LEN/2 bytes at `off` of the local buffer of `kind`. */
static struct ibv_sge sge_of(char *buf, struct ibv_mr *mr, int kind, int off)
{
	uint64_t base = kind == 5 ? IOVA : (uintptr_t)buf;
	struct ibv_sge s = { .addr = base + off, .length = LEN / 2, .lkey = mr->lkey };
	return s;
}

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_comp_channel *ch;
static struct ibv_qp *qp;
static struct ibv_srq *srq;

/* The target's QP takes its receive WRs from an SRQ. */
static void setup(const char *devname, int with_srq)
{
	ctx = open_named(devname);
	CHECK("async_fd is a descriptor", ctx->async_fd >= 0, "%d", ctx->async_fd);
	pd = ibv_alloc_pd(ctx);
	ch = ibv_create_comp_channel(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, ch, 0);
	if (with_srq) {
		struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
		srq = ibv_create_srq(pd, &sa);
		CHECK("create_srq", srq != NULL, "errno %d", errno);
	}
	struct ibv_qp_init_attr a = {
		.send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	qp = pd && cq ? ibv_create_qp(pd, &a) : NULL;
	CHECK("pd, channel, cq, qp", qp != NULL, "errno %d", errno);
}

static void hello_of(struct hello *h)
{
	union ibv_gid g;
	CHECK("query_gid 1", ibv_query_gid(ctx, 1, 1, &g) == 0, "");
	h->qpn = qp->qp_num;
	h->psn = 0x1234;
	memcpy(h->gid, g.raw, 16);
}

static void connect_qp(const struct hello *peer)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
						    IBV_ACCESS_REMOTE_READ };
	CHECK("INIT", ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						    IBV_QP_ACCESS_FLAGS) == 0, "");
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
				 .dest_qp_num = peer->qpn, .rq_psn = peer->psn, .max_dest_rd_atomic = 4,
				 .min_rnr_timer = 12 };
	r.ah_attr.is_global = 1;
	r.ah_attr.port_num = 1;
	r.ah_attr.grh.sgid_index = 1;
	r.ah_attr.grh.hop_limit = 64;
	memcpy(r.ah_attr.grh.dgid.raw, peer->gid, 16);
	CHECK("RTR", ibv_modify_qp(qp, &r, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
						   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
						   IBV_QP_MIN_RNR_TIMER) == 0, "");
	struct ibv_qp_attr s = { .qp_state = IBV_QPS_RTS, .timeout = 12, .retry_cnt = 7,
				 .rnr_retry = 7, .sq_psn = 0x1234, .max_rd_atomic = 4 };
	CHECK("RTS", ibv_modify_qp(qp, &s, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
						   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
						   IBV_QP_MAX_QP_RD_ATOMIC) == 0, "");
}

static struct ibv_wc wait_wc(void)
{
	return wait_wc_on(cq);
}

/* The next async event within `ms`, or -1. */
static int next_async(int ms, struct ibv_async_event *ev)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	if (poll(&p, 1, ms) != 1)
		return -1;
	if (ibv_get_async_event(ctx, ev))
		return -1;
	return ev->event_type;
}

/* The next port event within `ms` (a QP event of the access violation
 * before it is acknowledged and reported), or -1. */
static int next_port_event(int ms, struct ibv_async_event *ev)
{
	int t;
	while ((t = next_async(ms, ev)) == IBV_EVENT_QP_FATAL) {
		printf("target QP: %s\n", ibv_event_type_str(t));
		ibv_ack_async_event(ev);
	}
	return t;
}

static void fill(char *b, int n, int v)
{
	for (int i = 0; i < n; i++)
		b[i] = (char)(v + i * 7);
}

static int same(const char *b, int n, int v)
{
	for (int i = 0; i < n; i++)
		if (b[i] != (char)(v + i * 7))
			return 0;
	return 1;
}

static int target(int port, const char *dev, const char *netdev)
{
	char stack[LEN], ro_buf[4096], *b[KINDS];
	buffers(b, stack);
	setup(dev, 1);
	struct hello me = { 0 }, peer;
	hello_of(&me);
	struct ibv_mr *mr[KINDS];
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	for (int k = 0; k < KINDS; k++) {
		fill(b[k], LEN, k * 16);
		mr[k] = reg(pd, b[k], k, acc);
		me.r[k].addr = k == 5 ? IOVA : (uintptr_t)b[k];
		me.r[k].rkey = mr[k]->rkey;
	}
	struct ibv_mr *ro = ibv_reg_mr(pd, ro_buf, sizeof ro_buf, IBV_ACCESS_REMOTE_READ);
	CHECK("reg_mr read-only", ro != NULL, "errno %d", errno);
	memset(ro_buf, 0x5a, sizeof ro_buf);
	me.ro.addr = (uintptr_t)ro_buf;
	me.ro.rkey = ro->rkey;
	int fd = tcp(NULL, port);
	xfer(fd, &me, sizeof me, 1);
	xfer(fd, &peer, sizeof peer, 0);
	connect_qp(&peer);
	/* Two receives for the two SENDs, into the stack buffer's first
	 * bytes, through the SRQ; its limit 2 fires at the first taken. */
	for (int i = 0; i < 2; i++) {
		struct ibv_sge s = { .addr = (uintptr_t)stack + i * 64, .length = 64, .lkey = mr[3]->lkey };
		struct ibv_recv_wr w = { .wr_id = 100 + i, .sg_list = &s, .num_sge = 1 }, *bad;
		CHECK("post_srq_recv", ibv_post_srq_recv(srq, &w, &bad) == 0, "");
	}
	struct ibv_srq_attr lim = { .srq_limit = 2 };
	CHECK("modify_srq limit", ibv_modify_srq(srq, &lim, IBV_SRQ_LIMIT) == 0, "");
	CHECK("req_notify_cq solicited-only", ibv_req_notify_cq(cq, 1) == 0, "");
	xfer(fd, &me.qpn, 4, 1); /* ready */

	/* The unsolicited SEND completes without an event; the solicited
	 * one raises it. */
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	char go;
	xfer(fd, &go, 1, 0); /* the first SEND was sent and has completed */
	usleep(200000);
	CHECK("no event for an unsolicited SEND", poll(&p, 1, 0) == 0, "the channel is readable");
	xfer(fd, &go, 1, 1); /* now the solicited one */
	struct ibv_cq *ecq;
	void *ectx;
	int ep = epoll_create1(0);
	struct epoll_event ee = { .events = EPOLLIN }, got;
	CHECK("epoll_ctl ADD of the channel fd", epoll_ctl(ep, EPOLL_CTL_ADD, ch->fd, &ee) == 0, "");
	CHECK("an event for the solicited SEND (epoll)", epoll_wait(ep, &got, 1, 10000) == 1, "none in 10 s");
	close(ep);
	CHECK("get_cq_event", ibv_get_cq_event(ch, &ecq, &ectx) == 0 && ecq == cq, "");
	ibv_ack_cq_events(cq, 1);
	struct ibv_wc w1 = wait_wc(), w2 = wait_wc();
	CHECK("both receives, in order", w1.wr_id == 100 && w2.wr_id == 101 && w1.status == 0 && w2.status == 0,
	      "%llu %d %llu %d", (unsigned long long)w1.wr_id, w1.status, (unsigned long long)w2.wr_id,
	      w2.status);
	struct ibv_async_event sev;
	CHECK("SRQ_LIMIT_REACHED", next_async(5000, &sev) == IBV_EVENT_SRQ_LIMIT_REACHED &&
	      sev.element.srq == srq, "");
	ibv_ack_async_event(&sev);
	struct ibv_srq_attr q;
	CHECK("the limit disarmed itself", ibv_query_srq(srq, &q) == 0 && q.srq_limit == 0, "%u",
	      q.srq_limit);

	xfer(fd, &go, 1, 0); /* the initiator is done */
	for (int k = 0; k < KINDS; k++) {
		int first = k == 3 ? 128 : 0; /* the SENDs landed at the stack's start */
		CHECK("first half untouched", same(b[k] + first, LEN / 2 - first, k * 16 + first), "%s",
		      kind_name[k]);
		CHECK("second half written by the peer", same(b[k] + LEN / 2, LEN / 2, 200 + k),
		      "%s", kind_name[k]);
	}
	int ro_ok = 1;
	for (unsigned i = 0; i < sizeof ro_buf; i++)
		ro_ok &= ro_buf[i] == 0x5a;
	CHECK("the read-only region was not written", ro_ok, "");

	/* The port goes down and up again. */
	struct ibv_async_event ev;
	char cmd[256];
	snprintf(cmd, sizeof cmd, "ip link set dev %s down", netdev);
	CHECK("link down", system(cmd) == 0, "");
	CHECK("PORT_ERR", next_port_event(5000, &ev) == IBV_EVENT_PORT_ERR && ev.element.port_num == 1, "");
	ibv_ack_async_event(&ev);
	snprintf(cmd, sizeof cmd, "ip link set dev %s up", netdev);
	CHECK("link up", system(cmd) == 0, "");
	CHECK("PORT_ACTIVE", next_port_event(5000, &ev) == IBV_EVENT_PORT_ACTIVE && ev.element.port_num == 1,
	      "");
	printf("%s\n", ibv_event_type_str(ev.event_type));
	ibv_ack_async_event(&ev);
	xfer(fd, &go, 1, 1);
	return 0;
}

static int initiator(const char *peer_ip, int port, const char *dev)
{
	char stack[LEN], *b[KINDS];
	buffers(b, stack);
	setup(dev, 0);
	struct hello me = { 0 }, peer;
	hello_of(&me);
	struct ibv_mr *mr[KINDS];
	for (int k = 0; k < KINDS; k++)
		mr[k] = reg(pd, b[k], k, IBV_ACCESS_LOCAL_WRITE);
	int fd = tcp(peer_ip, port);
	xfer(fd, &peer, sizeof peer, 0);
	xfer(fd, &me, sizeof me, 1);
	connect_qp(&peer);
	uint32_t ready;
	xfer(fd, &ready, 4, 0);

	/* READ the first half of each remote region into the second half of
	 * the local buffer of the same kind; WRITE the first half out. */
	for (int k = 0; k < KINDS; k++) {
		struct ibv_sge s = sge_of(b[k], mr[k], k, LEN / 2);
		struct ibv_send_wr w = { .wr_id = k, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
					 .send_flags = IBV_SEND_SIGNALED }, *bad;
		w.wr.rdma.remote_addr = peer.r[k].addr;
		w.wr.rdma.rkey = peer.r[k].rkey;
		CHECK("post READ", ibv_post_send(qp, &w, &bad) == 0, "");
		struct ibv_wc wc = wait_wc();
		CHECK("READ completes", wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)k, "%s: %s",
		      kind_name[k], ibv_wc_status_str(wc.status));
		CHECK("READ brings the pattern", same(b[k] + LEN / 2, LEN / 2, k * 16), "%s", kind_name[k]);
		fill(b[k], LEN / 2, 200 + k);
		struct ibv_sge t = sge_of(b[k], mr[k], k, 0);
		struct ibv_send_wr v = { .wr_id = 10 + k, .sg_list = &t, .num_sge = 1,
					 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED };
		v.wr.rdma.remote_addr = peer.r[k].addr + LEN / 2;
		v.wr.rdma.rkey = peer.r[k].rkey;
		CHECK("post WRITE", ibv_post_send(qp, &v, &bad) == 0, "");
		wc = wait_wc();
		CHECK("WRITE completes", wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)(10 + k),
		      "%s: %s", kind_name[k], ibv_wc_status_str(wc.status));
		printf("%s: read and written\n", kind_name[k]);
	}

	/* SENDs: the first unsolicited, the second solicited. */
	char go = 1;
	for (int i = 0; i < 2; i++) {
		struct ibv_sge s = { .addr = (uintptr_t)b[0], .length = 64, .lkey = mr[0]->lkey };
		struct ibv_send_wr w = { .wr_id = 20 + i, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED | (i ? IBV_SEND_SOLICITED : 0) },
				   *bad;
		CHECK("post SEND", ibv_post_send(qp, &w, &bad) == 0, "");
		struct ibv_wc wc = wait_wc();
		CHECK("SEND completes", wc.status == IBV_WC_SUCCESS, "%s", ibv_wc_status_str(wc.status));
		if (i == 0) {
			xfer(fd, &go, 1, 1);
			xfer(fd, &go, 1, 0); /* the target saw no event */
		}
	}

	/* A WRITE to the read-only region: REM_ACCESS_ERR, and the QP is
	 * dead: QP_FATAL. */
	struct ibv_sge s = sge_of(b[0], mr[0], 0, 0);
	s.length = 64;
	struct ibv_send_wr w = { .wr_id = 30, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED }, *bad;
	w.wr.rdma.remote_addr = peer.ro.addr;
	w.wr.rdma.rkey = peer.ro.rkey;
	CHECK("post WRITE to a read-only region", ibv_post_send(qp, &w, &bad) == 0, "");
	struct ibv_wc wc = wait_wc();
	CHECK("REM_ACCESS_ERR", wc.status == IBV_WC_REM_ACCESS_ERR && wc.wr_id == 30, "%s",
	      ibv_wc_status_str(wc.status));
	struct ibv_async_event ev;
	CHECK("QP_FATAL on the QP", next_async(5000, &ev) == IBV_EVENT_QP_FATAL && ev.element.qp == qp, "");
	printf("%s\n", ibv_event_type_str(ev.event_type));
	ibv_ack_async_event(&ev);
	CHECK("destroy_qp after the ack", ibv_destroy_qp(qp) == 0, "");
	xfer(fd, &go, 1, 1);
	xfer(fd, &go, 1, 0); /* the target checked its memory and port */
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 5 && !strcmp(argv[1], "target"))
		target(atoi(argv[2]), argv[3], argv[4]);
	else if (argc == 6 && !strcmp(argv[1], "initiator"))
		initiator(argv[2], atoi(argv[3]), argv[4]);
	else {
		fprintf(stderr, "usage: features target PORT DEVICE NETDEV | initiator PEER PORT DEVICE NETDEV\n");
		return 2;
	}
	printf("all ok\n");
	return 0;
}
