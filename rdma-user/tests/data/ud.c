/* UD between two processes (two hosts) over the drop-in libibverbs, the
 * way a datagram server answers: from the completion. Built by
 * tests/ibverbs_abi.rs with Debian's libibverbs-dev headers.
 *
 * usage: ud server PORT DEVICE
 *        ud client SERVER_IPV4 PORT DEVICE
 *
 * The client first checks what rdma-core refuses on a UD QP and on
 * address handles (RC attributes, no GRH, an unreachable address, RDMA
 * WRITE, a bogus AH, a completion without a GRH), then sends a datagram
 * with immediate data to the server's QP through an AH made from the
 * server's GID. The server checks the completion (IBV_WC_GRH, src_qp,
 * byte_len, the GRH holding the IPv4 header), makes an AH with
 * ibv_create_ah_from_wc and answers; the client checks the answer. Last,
 * a datagram larger than the receive buffer the server posted completes
 * there with IBV_WC_LOC_LEN_ERR and leaves the bytes after it alone.
 *
 * Prints "ok NAME" per check, "all ok" at the end. */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "common.h"

enum { QKEY = 0x11111111, MSG = 1000, GRH = 40, SLOT = 2048, SMALL = 100 };

struct hello {
	uint32_t qpn;
	uint8_t gid[16];
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct ibv_mr *mr;
static char *buf;

static void setup(const char *devname)
{
	ctx = open_named(devname);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	buf = calloc(1, 8 * SLOT);
	mr = ibv_reg_mr(pd, buf, 8 * SLOT, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_init_attr a = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	qp = pd && cq && mr ? ibv_create_qp(pd, &a) : NULL;
	CHECK("create UD qp", qp != NULL && qp->qp_type == IBV_QPT_UD, "errno %d", errno);
}

static void bring_up(void)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	CHECK("INIT with a Q_Key", ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
							     IBV_QP_QKEY) == 0, "");
	a.qp_state = IBV_QPS_RTR;
	CHECK("RTR", ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0x123;
	CHECK("RTS", ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "");
}

static void post_recv(uint64_t id, int slot, uint32_t len)
{
	struct ibv_sge s = { .addr = (uintptr_t)buf + slot * SLOT, .length = len, .lkey = mr->lkey };
	struct ibv_recv_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad;
	CHECK("post_recv", ibv_post_recv(qp, &w, &bad) == 0, "");
}

static int post_send(struct ibv_ah *ah, uint32_t qpn, int slot, uint32_t len, uint32_t imm)
{
	struct ibv_sge s = { .addr = (uintptr_t)buf + slot * SLOT, .length = len, .lkey = mr->lkey };
	struct ibv_send_wr w = { .wr_id = 7, .sg_list = &s, .num_sge = 1,
				 .opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
				 .imm_data = htonl(imm) }, *bad;
	w.wr.ud.ah = ah;
	w.wr.ud.remote_qpn = qpn;
	w.wr.ud.remote_qkey = 0x80000000; /* the high bit: our own Q_Key */
	return ibv_post_send(qp, &w, &bad);
}

static struct ibv_wc wait_wc(void)
{
	return wait_wc_on(cq);
}

static struct ibv_ah *ah_to(const uint8_t *gid)
{
	struct ibv_ah_attr a = { .is_global = 1, .port_num = 1, .grh = { .sgid_index = 1, .hop_limit = 1 } };
	memcpy(a.grh.dgid.raw, gid, 16);
	return ibv_create_ah(pd, &a);
}

static void hello_of(struct hello *h)
{
	union ibv_gid g;
	CHECK("query_gid 1", ibv_query_gid(ctx, 1, 1, &g) == 0, "");
	h->qpn = qp->qp_num;
	memcpy(h->gid, g.raw, 16);
}

static int server(int port, const char *dev)
{
	setup(dev);
	bring_up();
	post_recv(1, 0, GRH + MSG);
	memset(buf + 2 * SLOT, 0xc3, SLOT);
	int fd = tcp(NULL, port);
	struct hello me, peer;
	hello_of(&me);
	xfer(fd, &me, sizeof me, 1);
	xfer(fd, &peer, sizeof peer, 0);

	struct ibv_wc wc = wait_wc();
	CHECK("the datagram arrives", wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV &&
					 wc.wr_id == 1, "%s", ibv_wc_status_str(wc.status));
	CHECK("IBV_WC_GRH and IBV_WC_WITH_IMM", (wc.wc_flags & IBV_WC_GRH) && (wc.wc_flags & IBV_WC_WITH_IMM) &&
							ntohl(wc.imm_data) == 0xabc, "flags %#x", wc.wc_flags);
	CHECK("src_qp is the sender's QP", wc.src_qp == peer.qpn, "%#x, want %#x", wc.src_qp, peer.qpn);
	CHECK("byte_len counts the GRH", wc.byte_len == GRH + MSG, "%u", wc.byte_len);
	int data_ok = 1;
	for (int i = 0; i < MSG; i++)
		data_ok &= (uint8_t)buf[GRH + i] == (uint8_t)(i * 7 + 1);
	CHECK("the payload after the GRH", data_ok, "");
	CHECK("the GRH holds the IPv4 header in its last 20 bytes",
	      (uint8_t)buf[20] == 0x45 && !memcmp(buf + 32, peer.gid + 12, 4) && !memcmp(buf + 36, me.gid + 12, 4),
	      "%02x", (uint8_t)buf[20]);
	struct ibv_ah_attr aa;
	CHECK("init_ah_from_wc", ibv_init_ah_from_wc(ctx, 1, &wc, (struct ibv_grh *)buf, &aa) == 0, "errno %d", errno);
	CHECK("... back to the sender's GID, from ours at index 1",
	      aa.is_global && !memcmp(aa.grh.dgid.raw, peer.gid, 16) && aa.grh.sgid_index == 1 && aa.port_num == 1,
	      "sgid_index %u", aa.grh.sgid_index);
	struct ibv_ah *ah = ibv_create_ah_from_wc(pd, &wc, (struct ibv_grh *)buf, 1);
	CHECK("create_ah_from_wc", ah != NULL, "errno %d", errno);
	for (int i = 0; i < MSG; i++)
		buf[SLOT + i] = (char)(i * 3 + 2);
	CHECK("answer", post_send(ah, wc.src_qp, 1, MSG, 0xdef) == 0, "");
	wc = wait_wc();
	CHECK("the answer leaves", wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND, "");

	/* A receive buffer too small for the next datagram. */
	post_recv(3, 2, SMALL);
	char go = 1;
	xfer(fd, &go, 1, 1);
	wc = wait_wc();
	CHECK("a datagram larger than the buffer is LOC_LEN_ERR", wc.wr_id == 3 && wc.status == IBV_WC_LOC_LEN_ERR,
	      "wr %lu %s", (unsigned long)wc.wr_id, ibv_wc_status_str(wc.status));
	int canary = 1;
	for (int i = SMALL; i < SLOT; i++)
		canary &= (uint8_t)buf[2 * SLOT + i] == 0xc3;
	CHECK("nothing past the buffer is written", canary, "");
	CHECK("destroy_ah", ibv_destroy_ah(ah) == 0, "");
	xfer(fd, &go, 1, 1);
	printf("all ok\n");
	return 0;
}

static int client(const char *ip, int port, const char *dev)
{
	setup(dev);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	CHECK("UD INIT with RC's access flags is EINVAL",
	      ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY |
				    IBV_QP_ACCESS_FLAGS) == EINVAL, "");
	CHECK("UD INIT without a Q_Key is EINVAL",
	      ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT) == EINVAL, "");
	bring_up();
	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qi;
	CHECK("query_qp: UD, its Q_Key", ibv_query_qp(qp, &q, IBV_QP_QKEY, &qi) == 0 && q.qkey == QKEY &&
						  qi.qp_type == IBV_QPT_UD, "qkey %#x", q.qkey);
	struct ibv_ah_attr nogrh = { .dlid = 1, .port_num = 1 };
	errno = 0;
	CHECK("create_ah without a GRH is EINVAL (RoCE)", ibv_create_ah(pd, &nogrh) == NULL && errno == EINVAL,
	      "errno %d", errno);
	/* An address on the link that nobody has: resolution times out. */
	struct hello none = { 0 };
	none.gid[10] = none.gid[11] = 0xff;
	inet_pton(AF_INET, ip, none.gid + 12);
	none.gid[15] = 250;
	errno = 0;
	CHECK("create_ah to an address nobody answers is EHOSTUNREACH", ah_to(none.gid) == NULL &&
										   errno == EHOSTUNREACH, "errno %d", errno);
	struct ibv_wc fake = { .wc_flags = 0 };
	struct ibv_ah_attr aa;
	errno = 0;
	CHECK("init_ah_from_wc without IBV_WC_GRH is -1 EINVAL",
	      ibv_init_ah_from_wc(ctx, 1, &fake, (struct ibv_grh *)buf, &aa) == -1 && errno == EINVAL, "");

	int fd = tcp(ip, port);
	struct hello me, peer;
	hello_of(&me);
	xfer(fd, &peer, sizeof peer, 0);
	xfer(fd, &me, sizeof me, 1);
	struct ibv_ah *ah = ah_to(peer.gid);
	CHECK("create_ah to the server's GID", ah != NULL, "errno %d", errno);
	struct ibv_sge s = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr w = { .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE }, *bad;
	w.wr.ud.ah = ah;
	CHECK("RDMA WRITE on a UD QP is EINVAL", ibv_post_send(qp, &w, &bad) == EINVAL && bad == &w, "");
	CHECK("a send with a bogus AH is EINVAL", post_send((struct ibv_ah *)buf, peer.qpn, 0, 8, 0) == EINVAL, "");

	post_recv(2, 4, GRH + MSG);
	for (int i = 0; i < MSG; i++)
		buf[SLOT + i] = (char)(i * 7 + 1);
	CHECK("send", post_send(ah, peer.qpn, 1, MSG, 0xabc) == 0, "");
	struct ibv_wc wc = wait_wc();
	CHECK("the send completes", wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND && wc.wr_id == 7, "");
	wc = wait_wc();
	CHECK("the answer arrives from the server's QP", wc.status == IBV_WC_SUCCESS && wc.wr_id == 2 &&
								 wc.src_qp == peer.qpn && ntohl(wc.imm_data) == 0xdef &&
								 wc.byte_len == GRH + MSG, "src_qp %#x", wc.src_qp);
	int data_ok = 1;
	for (int i = 0; i < MSG; i++)
		data_ok &= (uint8_t)buf[4 * SLOT + GRH + i] == (uint8_t)(i * 3 + 2);
	CHECK("the answer's payload", data_ok, "");
	char go;
	xfer(fd, &go, 1, 0);
	CHECK("send the datagram too large for the server's buffer", post_send(ah, peer.qpn, 1, MSG, 1) == 0, "");
	wc = wait_wc();
	CHECK("it completes here all the same", wc.status == IBV_WC_SUCCESS, "");
	xfer(fd, &go, 1, 0);
	CHECK("destroy_ah", ibv_destroy_ah(ah) == 0, "");
	CHECK("destroy_ah twice is EINVAL", ibv_destroy_ah(ah) == EINVAL, "");
	CHECK("destroy_qp", ibv_destroy_qp(qp) == 0, "");
	printf("all ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 4 && !strcmp(argv[1], "server"))
		return server(atoi(argv[2]), argv[3]);
	if (argc == 5 && !strcmp(argv[1], "client"))
		return client(argv[2], atoi(argv[3]), argv[4]);
	fprintf(stderr, "usage: ud server PORT DEVICE | ud client SERVER_IPV4 PORT DEVICE\n");
	return 2;
}
