// A structured push supplier for any OMG Notification Service channel (Java, standard org.omg stubs only).
//
//   java ... Supplier [--factory REF | --factory-file PATH] [--channel ID] [--count N] [--text TEXT]
//
// Same behaviour and output as examples/python/supplier.py; build and run lines in docs/clients.md.
import org.omg.CORBA.IntHolder;
import org.omg.CORBA.ORB;
import org.omg.CosNotification.StructuredEvent;
import org.omg.CosNotifyChannelAdmin.ChannelNotFound;
import org.omg.CosNotifyChannelAdmin.ClientType;
import org.omg.CosNotifyChannelAdmin.EventChannel;
import org.omg.CosNotifyChannelAdmin.StructuredProxyPushConsumer;
import org.omg.CosNotifyChannelAdmin.StructuredProxyPushConsumerHelper;

public final class Supplier {
    public static void main(String[] args) {
        ORB orb = Example.initOrb(args);
        int rc = 1;
        try {
            Example opt = Example.parse(args);
            IntHolder cid = new IntHolder();
            EventChannel channel = opt.openChannel(opt.resolveFactory(orb), cid);
            System.out.println("channel " + cid.value);
            StructuredProxyPushConsumer proxy = StructuredProxyPushConsumerHelper.narrow(
                    channel.default_supplier_admin().obtain_notification_push_consumer(
                            ClientType.STRUCTURED_EVENT, new IntHolder()));
            // A nil supplier reference is allowed for a push supplier: the channel then never calls back.
            proxy.connect_structured_push_supplier(null);
            for (int seq = 0; seq < opt.count; seq++) {
                StructuredEvent ev = Example.makeEvent(orb, seq, opt.text);
                proxy.push_structured_event(ev);
                System.out.println("pushed " + Example.describe(ev));
            }
            proxy.disconnect_structured_push_consumer();
            rc = 0;
        } catch (ChannelNotFound e) {
            System.err.println("supplier: that channel does not exist");
        } catch (org.omg.CORBA.UserException | org.omg.CORBA.SystemException e) {
            System.err.println("supplier: CORBA error " + e);
        } catch (java.io.IOException | IllegalArgumentException e) {
            System.err.println("supplier: " + e.getMessage());
        } finally {
            orb.shutdown(true);
        }
        System.exit(rc);
    }
}
