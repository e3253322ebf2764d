// A structured push consumer for any OMG Notification Service channel (Java, standard org.omg stubs only).
//
//   java ... Consumer [--factory REF | --factory-file PATH] [--channel ID] [--count N] [--timeout S]
//
// Same behaviour and output as examples/python/consumer.py; build and run lines in docs/clients.md. The channel
// calls this process back: JacORB listens on 127.0.0.1 unless -DOAIAddr=HOST names another address.
import java.util.concurrent.TimeUnit;

import org.omg.CORBA.IntHolder;
import org.omg.CORBA.ORB;
import org.omg.CosNotification.EventType;
import org.omg.CosNotification.StructuredEvent;
import org.omg.CosNotifyChannelAdmin.ChannelNotFound;
import org.omg.CosNotifyChannelAdmin.ClientType;
import org.omg.CosNotifyChannelAdmin.EventChannel;
import org.omg.CosNotifyChannelAdmin.StructuredProxyPushSupplier;
import org.omg.CosNotifyChannelAdmin.StructuredProxyPushSupplierHelper;
import org.omg.CosNotifyComm.StructuredPushConsumerHelper;
import org.omg.CosNotifyComm.StructuredPushConsumerPOA;
import org.omg.PortableServer.POA;
import org.omg.PortableServer.POAHelper;

public final class Consumer {
    /** Prints every event. The ORB calls it on its own threads: only print and count here. */
    static final class Printer extends StructuredPushConsumerPOA {
        private int received;
        private boolean disconnected;

        @Override
        public synchronized void push_structured_event(StructuredEvent ev) {
            System.out.println("received " + Example.describe(ev));
            received++;
            notifyAll();
        }

        @Override
        public void offer_change(EventType[] added, EventType[] removed) {
            // the event types suppliers offer changed; this consumer takes everything
        }

        @Override
        public synchronized void disconnect_structured_push_consumer() {
            disconnected = true;
            notifyAll();
        }

        /** true once count events arrived (count 0: never); false on timeout or when disconnected. */
        synchronized boolean await(int count, double timeoutS) throws InterruptedException {
            long deadline = System.nanoTime() + (long) (timeoutS * 1e9);
            while (!disconnected && (count == 0 || received < count)) {
                long left = deadline - System.nanoTime();
                if (left <= 0) return false;
                TimeUnit.NANOSECONDS.timedWait(this, left);
            }
            return !disconnected;
        }

        synchronized int received() { return received; }

        synchronized boolean disconnected() { return disconnected; }
    }

    public static void main(String[] args) {
        ORB orb = Example.initOrb(args);
        int rc = 1;
        try {
            Example opt = Example.parse(args);
            POA poa = POAHelper.narrow(orb.resolve_initial_references("RootPOA"));
            poa.the_POAManager().activate();
            IntHolder cid = new IntHolder();
            EventChannel channel = opt.openChannel(opt.resolveFactory(orb), cid);
            StructuredProxyPushSupplier proxy = StructuredProxyPushSupplierHelper.narrow(
                    channel.default_consumer_admin().obtain_notification_push_supplier(
                            ClientType.STRUCTURED_EVENT, new IntHolder()));
            Printer printer = new Printer();
            proxy.connect_structured_push_consumer(
                    StructuredPushConsumerHelper.narrow(poa.servant_to_reference(printer)));
            System.out.println("ready channel=" + cid.value);
            boolean complete = printer.await(opt.count, opt.count > 0 ? opt.timeout : 1e9);
            if (!printer.disconnected()) proxy.disconnect_structured_push_supplier();
            System.out.println("done: received " + printer.received() + " of " + opt.count);
            rc = complete ? 0 : 1;
        } catch (ChannelNotFound e) {
            System.err.println("consumer: that channel does not exist");
        } catch (org.omg.CORBA.UserException | org.omg.CORBA.SystemException e) {
            System.err.println("consumer: CORBA error " + e);
        } catch (java.io.IOException | IllegalArgumentException | InterruptedException e) {
            System.err.println("consumer: " + e.getMessage());
        } finally {
            orb.shutdown(false);
        }
        System.exit(rc);
    }
}
